"""Prints how closely `ppserve run` agrees with the numpy reference on every end-to-end case, in
both formats: max|Δ|/max|ref| per logits row (worst over the steps) and whether greedy tokens match.
The e2e tests assert the bound; this reports the figures. Run with Debian's python3 from the
repository root after building: /usr/bin/python3 tests/reference/report_agreement.py"""
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from conftest import PPSERVE, ppserve_run, reference, rel_err  # noqa: E402
from test_reference import CASES, PROMPT, STEPS  # noqa: E402


def main():
    tmp = Path(tempfile.mkdtemp(prefix="pp-agreement-"))
    worst = 0.0
    all_equal = True
    for case, flags in sorted(CASES.items()):
        out = tmp / case
        subprocess.run([PPSERVE, "synth", "--out", str(out), "--format", "both", *flags],
                       check=True, capture_output=True)
        for fmt in ("gguf", "hf"):
            model = out / "model.gguf" if fmt == "gguf" else out / "hf"
            got, logits = ppserve_run(model, PROMPT, STEPS, tmp)
            ref_ids, ref_logits = reference(model, PROMPT, got["ids"], tmp)
            err = float(rel_err(logits, ref_logits).max())
            equal = got["ids"] == ref_ids
            worst = max(worst, err)
            all_equal = all_equal and equal
            print(f"{case:32s} {fmt:5s} max_rel_err={err:.2e} greedy_equal={equal}")
    print(f"worst max_rel_err={worst:.2e} greedy_equal_everywhere={all_equal}")
    subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()

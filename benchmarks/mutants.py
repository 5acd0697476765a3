"""A small mutation check of the core maths: does the test suite notice one-line mistakes?

Each mutant is one line of ``cocos/`` replaced by a plausible wrong version. For each, the
repository (``cocos/``, ``tests/``, ``pyproject.toml``) is copied to a temporary folder, the line
is changed there, and the test files that guard it run against the copy (``python -m pytest``
from the copy's root imports the copy's ``cocos``). A mutant is *killed* when a test fails.

    python benchmarks/mutants.py [--only NAME]

Add a mutant here whenever a change touches maths that a test should guard; every mutant
below must be killed (the exit code is the number that survive).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (file, original line, mutated line, test files)
MUTANTS = {
    "triplet_hinge without the padded-positive mask": (
        "cocos/losses/functional.py",
        '    return kernels.fill_outside(hinge, float("-inf"), valid[..., :, None], view.neg[..., None, :])',
        '    return kernels.fill_outside(hinge, float("-inf"), view.neg[..., None, :])',
        ["tests/test_oracle.py"]),
    "GOAL backward ignores the upstream gradient": (
        "cocos/losses/goal.py",
        "        return upstream * grad, None, None",
        "        return grad, None, None",
        ["tests/test_goal_objective.py"]),
    "SmoothAP companions without the negatives mask": (
        "cocos/losses/smoothap.py",
        "        neg_w = torch.where(view.neg, w.sum(-2), 0.0)",
        "        neg_w = w.sum(-2)",
        ["tests/test_counting_hand.py"]),
    "Triplet violation >= instead of > (a hinge of exactly 0 counts)": (
        "cocos/losses/reducers.py",
        "        return terms > self.eps",
        "        return terms >= self.eps",
        ["tests/test_counting_hand.py", "tests/test_oracle.py"]),
    "GOAL MS mean counts the selected pair again": (
        "cocos/losses/goal.py",
        "        return torch.where(n > 0, total / n.clamp_min(1), torch.full_like(total, neutral))",
        "        return (neutral + total) / (1 + n)",
        ["tests/test_goal.py"]),
    # issue 37: trust at the edges
    "VSE-infinity augmentation: one random piece repeated for a replaced word": (
        "cocos/data/wordpiece.py",
        "                out += torch.randint(len(self._tokens), (n,), generator=generator).tolist()",
        "                out += torch.randint(len(self._tokens), (1,), generator=generator).tolist() * n",
        ["tests/test_hf_folders.py"]),
    "Tracker counts a due batch whose number of captions changed": (
        "cocos/training/track.py",
        "        return shape == self.shape",
        "        return shape[0] == self.shape[0]",
        ["tests/test_tracker_edges.py"]),
    "budgeted unpickler does not charge DUP": (
        "cocos/safeload.py",
        "for _code in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET, pickle.DUP):",
        "for _code in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET):",
        ["tests/test_hostile_memory.py"]),
    "budgeted unpickler weighs a container one level deep": (
        "cocos/safeload.py",
        "if isinstance(c, _LEAVES) else self._weights[id(c)][1] for c in children)",
        "for c in children)",
        ["tests/test_hostile_memory.py"]),
    "weights-hash cache keyed without the modification time": (
        "cocos/models/weights.py",
        "            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)",
        "            key = (st.st_dev, st.st_ino, st.st_size)",
        ["tests/test_weights.py"]),
    "learned temperature not clamped after each step": (
        "cocos/training/trainer.py",
        "        if self.setup.learned:\n            self.loss_fn.project_()  # open_clip",
        "        if False:\n            self.loss_fn.project_()  # open_clip",
        ["tests/test_learned_temperature.py"]),
    "hinge-term plugins counted in blocks": (
        "cocos/losses/reducers.py",
        "        return False",
        "        return True",
        ["tests/test_counting_blocks.py"]),
}


def run(name: str, file: str, original: str, mutated: str, tests: list[str]) -> bool:
    """True when the mutant is killed."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        for item in ("cocos", "tests"):
            shutil.copytree(ROOT / item, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
        target = copy / file
        text = target.read_text(encoding="utf-8")
        if text.count(original) != 1:
            raise SystemExit(f"{name}: the line to mutate is not (exactly once) in {file}; update MUTANTS")
        target.write_text(text.replace(original, mutated), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(copy)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests],
                              cwd=copy, env=env, capture_output=True, text=True)
        return done.returncode != 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the mutants whose name contains this text")
    a = parser.parse_args()
    survived = 0
    for name, (file, original, mutated, tests) in MUTANTS.items():
        if a.only and a.only not in name:
            continue
        killed = run(name, file, original, mutated, tests)
        survived += not killed
        print(f"{'killed  ' if killed else 'SURVIVED'}  {name}  ({file})")
    sys.exit(survived)


if __name__ == "__main__":
    main()

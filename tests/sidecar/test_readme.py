"""The README's Python snippets run as written, in the README's order, next to the recorder its
first minute starts (`tracedb serve` on ./.tracedb)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.serving import ROOT, Serve


def _python_snippets() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_the_readme_snippets_run_in_order_next_to_a_running_recorder(tmp_path):
    snippets = _python_snippets()
    assert len(snippets) >= 3
    recorder = Serve(str(tmp_path / ".tracedb"))
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    env.pop("TRACEDB_DATA_DIR", None)
    try:
        outputs = []
        for code in snippets:
            r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
            outputs.append(r.stdout)
    finally:
        code, err = recorder.terminate()
    assert code == 0, err
    assert "{'answer': 'Paris'}" in outputs[0]

"""The README's Python quick start runs as written (against the fixture master's address)."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def quick_start_program():
    text = README.read_text()
    section = text.split("## Python quick start", 1)[1]
    match = re.search(r"python - <<'PY'\n(.*?)\nPY\n", section, re.S)
    assert match, "README's Python quick start has no python heredoc"
    return match.group(1)


def test_readme_quick_start_runs(master):
    program = quick_start_program().replace("127.0.0.1:50051", master.address)
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("b'hello' localhost:")


def test_readme_pd_disaggregation_example_runs():
    section = README.read_text().split("### PD disaggregation", 1)[1]
    match = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert match, "README's PD disaggregation section has no python block"
    run = subprocess.run([sys.executable, "-c", match.group(1)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr

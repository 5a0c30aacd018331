"""docs/compression.md's example runs on 2 ranks and prints what the doc shows."""

import io
import re
import sys
from pathlib import Path

from commflow.runtime.launcher import launch

DOC = Path(__file__).resolve().parents[2] / "docs" / "compression.md"


def test_quantized_allreduce_example(tmp_path):
    text = DOC.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    shown = re.search(r"```console\n\$ commflow run -n 2 quantized.py\n(.*?)```", text, re.S)
    script = tmp_path / "quantized.py"
    script.write_text(code)
    out, err = io.BytesIO(), io.BytesIO()
    status = launch([sys.executable, str(script)], 2, stdout=out, stderr=err, timeout=60,
                    env={"OMP_NUM_THREADS": "1"})
    assert status == 0, err.getvalue().decode()
    lines = sorted(out.getvalue().decode().splitlines())
    assert lines == shown.group(1).splitlines()

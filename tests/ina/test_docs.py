"""docs/ina.md's commands: the switch it starts and the example it runs on 2 ranks."""

import io
import re
import shlex
import socket
import sys
from pathlib import Path

from commflow.runtime.launcher import launch
from tests.ina.conftest import SwitchProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "ina.md"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_live_switch_example(tmp_path):
    text = DOC.read_text()
    switch = re.search(r"```console\n\$ commflow ina switch (.*)\n(listening on .*)\n```", text)
    code = re.search(r"```python\n(import numpy.*?)```", text, re.S).group(1)
    shown = re.search(r"```console\n\$ commflow run -n 2 ina_example.py\n(.*?)```", text, re.S)
    port = str(free_port())
    proc = SwitchProcess(*shlex.split(switch.group(1).replace("9999", port)))
    try:
        assert proc.line == switch.group(2).replace("9999", port)
        script = tmp_path / "ina_example.py"
        script.write_text(code.replace("9999", port))
        out, err = io.BytesIO(), io.BytesIO()
        status = launch([sys.executable, str(script)], 2, stdout=out, stderr=err, timeout=60,
                        env={"OMP_NUM_THREADS": "1"})
        assert status == 0, err.getvalue().decode()
        assert sorted(out.getvalue().decode().splitlines()) == shown.group(1).splitlines()
    finally:
        line = proc.stop()
    assert "1 sessions (0 refused)" in line

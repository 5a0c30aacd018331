"""`commflow synth --by-size`: one MSCCL file per size range, each within the runtime's
rules, with the range as minBytes/maxBytes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tests.ir.msccl_conformance import violations


def test_cli_writes_one_loadable_file_per_range(commflow, tmp_path):
    run = commflow("synth", "allgather", "--topo", "dgx1", "--by-size", "-b", "1K", "-e", "4G",
                   "-f", "16", "--xml", str(tmp_path / "set"), "--target", "rccl", "--json")
    assert run.code == 0, run.stderr
    records = json.loads(run.stdout)
    assert records[0]["min_bytes"] == 0
    for rec in records:
        text = (tmp_path / "set" / f"allgather-{rec['min_bytes']}-{rec['max_bytes']}.xml"
                ).read_text()
        assert violations(text, "rccl") == []
        algo = ET.fromstring(text)
        assert (int(algo.get("minBytes")), int(algo.get("maxBytes"))) == (rec["min_bytes"],
                                                                            rec["max_bytes"])

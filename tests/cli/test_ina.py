"""``commflow ina switch``: bad arguments are one error line and exit status 2."""

import socket


def test_bad_worker_count(commflow):
    run = commflow("ina", "switch", "--port", "0", "-n", "0")
    assert run.code == 2
    assert "error: ina switch: 0 workers; use 1 to 64" in run.stderr


def test_port_in_use(commflow):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        run = commflow("ina", "switch", "--port", str(port), "-n", "2")
    assert run.code == 2
    assert f"cannot bind UDP 127.0.0.1:{port}" in run.stderr and "--port" in run.stderr

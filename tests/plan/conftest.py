"""The ``commflow`` CLI fixture of tests/cli, for the planner's CLI and doc tests."""

from tests.cli.conftest import commflow  # noqa: F401

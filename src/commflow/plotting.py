"""matplotlib for the commands that draw PNGs: imported only when asked for, on the Agg
backend (no display), and saved with one clear error."""

from __future__ import annotations

import os
from typing import Any

from commflow.errors import CommflowError


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend. Raises ``CommflowError`` saying that
    ``what`` (e.g. ``"--plot"``) needs matplotlib when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommflowError(f"{what} needs matplotlib: pip install 'commflow[plot]'") from None
    return plt


def save(fig: Any, path: str | os.PathLike, **options: Any) -> None:
    """Write ``fig`` to ``path`` (``options`` go to ``savefig``; dpi 110 by default) and close
    it. Raises ``CommflowError`` when ``path`` cannot be written."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, **{"dpi": 110, **options})
    except OSError as error:
        raise CommflowError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)

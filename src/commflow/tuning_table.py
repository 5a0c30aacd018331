"""The tuning table: which algorithm to run per collective, rank count and size range, for one
topology (by fingerprint). :mod:`commflow.tune` writes it; a runtime reads it.

JSON document ``{"format": "commflow.tuning", "version": 1, "fingerprint": "...",
"topology": "dgx1", "model": "flow", "rules": [{"collective": "allreduce", "nranks": 8,
"min_bytes": 0, "max_bytes": 65535, "algo": "double_binary_tree", "time_us": 12.3}, ...]}``:
ranges are inclusive and do not overlap per ``(collective, nranks)``; ``time_us`` is the
predicted (or measured) time at the largest size tuned within the range, for information.
Reading is strict: a malformed document raises :class:`~commflow.errors.CommflowError`
naming the field.

A rule may hold for one placement only (version 2): ``"placement": "in_place"`` or
``"out_of_place"`` (in place: the output is the input; allgather's input is this rank's block
of the output, reduce-scatter's output this rank's block of the input). A rule without the
field holds for both and may not overlap any other rule of its collective and rank count; two
rules for one placement may not overlap each other. A table with no placement rule is written
as version 1, which older commflow reads; version 1 and 2 documents are read.

:meth:`TuningTable.to_nccl_csv` writes the rules NCCL's example tuner plugin reads
(``NCCL_TUNER_CONFIG_FILE``: ``collective_type,min_bytes,max_bytes,algorithm,protocol,channels,
nNodes,nRanks``), for the algorithms NCCL has (ring and multi-ring as ``ring``, double binary
tree as ``tree`` for allreduce), from the rules for both placements (NCCL's rules cannot tell
placements apart).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from commflow.collectives import Collective, parse_collective
from commflow.errors import CommflowError

FORMAT = "commflow.tuning"
VERSION = 2
"""The version written when a rule holds for one placement (else version 1)."""
VERSIONS = (1, 2)
"""Versions read."""
ANY = "any"
IN_PLACE = "in_place"
OUT_OF_PLACE = "out_of_place"
PLACEMENTS = (ANY, IN_PLACE, OUT_OF_PLACE)
"""What a rule's ``placement`` may be: both placements, in place only, out of place only."""
NCCL_ALGOS = {"ring": "ring", "multi_ring": "ring", "double_binary_tree": "tree"}
"""commflow algorithms NCCL also has, by NCCL's tuner name (NCCL runs ``tree`` for allreduce
only)."""
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
"""The protocols NCCL's example tuner plugin reads; it has no "any": a rule forces its
algorithm with one protocol (anything else reads as ``simple``)."""
_NCCL_COLLS = {Collective.ALLREDUCE: "allreduce", Collective.ALLGATHER: "allgather",
               Collective.REDUCESCATTER: "reducescatter", Collective.BROADCAST: "broadcast",
               Collective.REDUCE: "reduce"}
_MAX_SIZE = 2**63 - 1


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Run ``algo`` for ``collective`` on ``nranks`` ranks at sizes ``min_bytes..max_bytes``
    (bytes, inclusive, nccl-tests convention)."""

    collective: Collective
    """The collective."""
    nranks: int
    """Ranks of the communicator."""
    min_bytes: int
    """Smallest size the rule covers."""
    max_bytes: int
    """Largest size the rule covers."""
    algo: str
    """Registered algorithm name, or a program file's name."""
    time_us: float
    """Time in microseconds (predicted or measured) at the largest size tuned in the range."""
    placement: str = ANY
    """Which calls the rule holds for (:data:`PLACEMENTS`): both, in place, out of place."""

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise CommflowError(f"tuning rule: placement must be one of {', '.join(PLACEMENTS)}, "
                                f"got {self.placement!r}")
        if not (isinstance(self.nranks, int) and self.nranks >= 1):
            raise CommflowError(f"tuning rule: nranks must be an integer >= 1, got {self.nranks!r}")
        if not (isinstance(self.min_bytes, int) and isinstance(self.max_bytes, int)
                and 0 <= self.min_bytes <= self.max_bytes <= _MAX_SIZE):
            raise CommflowError(
                f"tuning rule: need 0 <= min_bytes <= max_bytes < 2**63 (integers), got "
                f"{self.min_bytes!r}..{self.max_bytes!r}")
        if not (isinstance(self.algo, str) and self.algo):
            raise CommflowError(f"tuning rule: algo must be a non-empty string, got {self.algo!r}")
        if not (isinstance(self.time_us, int | float) and not isinstance(self.time_us, bool)
                and math.isfinite(self.time_us) and self.time_us >= 0):
            raise CommflowError(f"tuning rule: time_us must be a finite number >= 0, got "
                                f"{self.time_us!r}")


@dataclass(frozen=True, kw_only=True)
class TuningTable:
    """Rules for one topology; see the module docstring."""

    fingerprint: str
    """:func:`commflow.topology.fingerprint` of the topology the rules were made for."""
    topology: str
    """The topology's name, for people."""
    model: str
    """Where the times come from: a simulator model (``alphabeta``, ``flow``) or ``live``."""
    rules: tuple[Rule, ...]
    """The rules, sorted by collective, rank count and size."""

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.rules, key=lambda r: (r.collective.value, r.nranks,
                                                          r.min_bytes, r.placement)))
        object.__setattr__(self, "rules", ordered)
        for placement in (IN_PLACE, OUT_OF_PLACE):
            held = [r for r in ordered if r.placement in (ANY, placement)]
            for a, b in zip(held, held[1:], strict=False):
                if (a.collective, a.nranks) == (b.collective, b.nranks) and \
                        b.min_bytes <= a.max_bytes:
                    raise CommflowError(
                        f"tuning table: {a.collective.value} on {a.nranks} ranks has "
                        f"overlapping rules ({a.min_bytes}..{a.max_bytes} {a.placement} and "
                        f"{b.min_bytes}..{b.max_bytes} {b.placement})")

    def lookup(self, collective: Collective | str, nranks: int, size: int, *,
               in_place: bool = False) -> str | None:
        """The algorithm for a ``size``-byte ``collective`` on ``nranks`` ranks called in
        place or out of place, or ``None`` when no rule covers it."""
        coll = parse_collective(collective)
        placement = IN_PLACE if in_place else OUT_OF_PLACE
        for rule in self.rules:
            if (rule.collective, rule.nranks) == (coll, nranks) and \
                    rule.placement in (ANY, placement) and \
                    rule.min_bytes <= size <= rule.max_bytes:
                return rule.algo
        return None

    def by_placement(self) -> bool:
        """Whether a rule holds for one placement only."""
        return any(r.placement != ANY for r in self.rules)

    def to_json(self) -> str:
        """The table as a ``commflow.tuning`` JSON document: version 1 (rules without a
        ``placement``) unless a rule holds for one placement only (:meth:`by_placement`)."""
        rules = [{key: value.value if key == "collective" else value
                  for key, value in asdict(r).items() if key != "placement" or value != ANY}
                 for r in self.rules]
        return json.dumps({"format": FORMAT, "version": VERSION if self.by_placement() else 1,
                           "fingerprint": self.fingerprint, "topology": self.topology,
                           "model": self.model, "rules": rules}, indent=1)

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``; ``CommflowError`` when it cannot be written."""
        try:
            Path(path).write_text(self.to_json())
        except OSError as error:
            raise CommflowError(f"cannot write tuning table {path}: {error.strerror}") from None

    def to_nccl_csv(self, *, nnodes: int = -1, protocol: str = "simple",
                    channels: int = -1) -> str:
        """Rules for NCCL's example tuner plugin, one line per rule whose algorithm NCCL has
        for its collective (:data:`NCCL_ALGOS`; others are left to NCCL's own choice), with
        ``protocol`` (one of :data:`NCCL_PROTOCOLS`: the plugin forces a protocol with the
        algorithm) and ``channels`` (``-1``: the plugin's "keep NCCL's", docs/tuning.md),
        under a header comment; rules for one placement are left to NCCL too.
        ``CommflowError`` for another protocol or a channel count below 1 other than -1."""
        check_nccl_options(protocol, channels)
        lines = ["# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,"
                 "nRanks"]
        for r in self.rules:
            algo = NCCL_ALGOS.get(r.algo)
            if (algo is None or r.collective not in _NCCL_COLLS or r.placement != ANY
                    or algo == "tree" and r.collective is not Collective.ALLREDUCE):
                continue
            lines.append(f"{_NCCL_COLLS[r.collective]},{r.min_bytes},{r.max_bytes},{algo},"
                         f"{protocol},{channels},{nnodes},{r.nranks}")
        return "\n".join(lines) + "\n"


def check_nccl_options(protocol: str, channels: int) -> None:
    """``CommflowError`` unless ``protocol`` is one of :data:`NCCL_PROTOCOLS` and
    ``channels`` is -1 or at least 1 (what :meth:`TuningTable.to_nccl_csv` writes)."""
    if protocol not in NCCL_PROTOCOLS:
        raise CommflowError(f"NCCL tuner rules: protocol {protocol!r} is not one of "
                            f"{', '.join(NCCL_PROTOCOLS)}")
    if channels < 1 and channels != -1:
        raise CommflowError(f"NCCL tuner rules: channels {channels} must be -1 (NCCL's "
                            "choice) or at least 1")


def from_json(text: str) -> TuningTable:
    """Parse a ``commflow.tuning`` document; ``CommflowError`` naming the bad field."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CommflowError(f"tuning table: not JSON ({error})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CommflowError(f"tuning table: 'format' must be {FORMAT!r}")
    version = doc.get("version")
    if version not in VERSIONS or isinstance(version, bool):
        raise CommflowError(f"tuning table: version {version!r} is not supported (this "
                            f"commflow reads versions {', '.join(map(str, VERSIONS))})")
    for key in ("fingerprint", "topology", "model"):
        if not isinstance(doc.get(key), str):
            raise CommflowError(f"tuning table: {key!r} must be a string")
    if not isinstance(doc.get("rules"), list):
        raise CommflowError("tuning table: 'rules' must be a list")
    rules = []
    fields = {"collective", "nranks", "min_bytes", "max_bytes", "algo", "time_us"}
    for i, item in enumerate(doc["rules"]):
        if not isinstance(item, dict) or not (
                set(item) == fields or version == 2 and set(item) == fields | {"placement"}):
            also = " (and, in version 2, placement)" if version == 2 else ""
            raise CommflowError(f"tuning table: rules[{i}] must have exactly the fields "
                                f"{', '.join(sorted(fields))}{also}")
        try:
            rules.append(Rule(**{**item, "collective": parse_collective(str(item["collective"]))}))
        except CommflowError as error:
            raise CommflowError(f"rules[{i}]: {error}") from None
    return TuningTable(fingerprint=doc["fingerprint"], topology=doc["topology"],
                       model=doc["model"], rules=tuple(rules))


def load_table(path: str | Path) -> TuningTable:
    """Read a tuning table file; ``CommflowError`` when missing or malformed."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise CommflowError(f"cannot read tuning table {path}: {error.strerror}") from None
    return from_json(text)

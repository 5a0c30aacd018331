"""An independent statement of the rules MSCCL-family runtimes apply when they load an XML
algorithm, for checking commflow's exports without trusting its exporter.

Sources (read, not copied): MSCCL on NCCL 2.12 (`src/graph/xml.h`, `src/misc/msccl*`,
`src/include/msccl.h`), msccl-executor-nccl and RCCL (`src/misc/msccl/msccl_parser.cc`,
`src/include/msccl/msccl_struct.h`, `msccl_scheduler.cc`):

- the parsers keep an element's children in fixed arrays of 1,024 and the elements they keep in
  one of 4,096 (MSCCL 2.12 keeps every element of the file; msccl-executor and RCCL keep the
  <algo>, every <gpu>, and only the loading rank's <tb> and <step> elements:
  `mscclAlgoXmlGpu` skips other ranks' children); an overflow fails communicator init;
- at most 256 steps per threadblock in MSCCL (`MSCCL_MAX_NUM_STEPS`), 64 in msccl-executor and
  RCCL by default; at most 216 threadblocks per rank in MSCCL, 64 in RCCL
  (`MSCCL_MAX_NUM_THREAD_BLOCKS`), 32 x MAXCHANNELS = 1,024 in msccl-executor; 32 channels;
- `depid` is stored in a signed 8-bit integer; `cnt` below `MSCCL_MAX_COUNT` = 72; `srcoff`
  and `dstoff` in signed 16-bit fields (`mscclTransmission`, MSCCL 2.12's `mscclTransfer`);
- step types s, r, rcs, rrs, rrc, rrcs, cpy, re, nop; buffers i, o, s; offsets within the
  gpu's i_chunks, o_chunks, s_chunks; steps numbered 0, 1, 2, ...; a dependency names an
  existing step of another threadblock, which carries hasdep="1";
- one threadblock per (send peer, channel) and per (receive peer, channel) on a rank;
- `coll`: reduce_scatter in MSCCL 2.12, reducescatter in msccl-executor and RCCL; gather and
  scatter only in the latter; the executor and RCCL select an algorithm only when the call's
  count is divisible by nchunksperloop and its bytes lie within [minBytes, maxBytes]
  (maxBytes 0: no upper end), and MSCCL 2.12 sizes its scratch buffer as
  maxBytes * s_chunks / nchunksperloop, so maxBytes must be a real size.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

LIMITS = {
    "msccl": {"steps": 256, "tbs": 216},
    "msccl-executor": {"steps": 64, "tbs": 1024},
    "rccl": {"steps": 64, "tbs": 64},
}
COLLECTIVES = {
    "msccl": {"allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce"},
    "msccl-executor": {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast",
                       "reduce", "gather", "scatter"},
}
COLLECTIVES["rccl"] = COLLECTIVES["msccl-executor"]
TYPES = {"s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop"}
SENDS = {"s", "rcs", "rrs", "rrcs"}
RECEIVES = {"r", "rcs", "rrs", "rrc", "rrcs"}
READS = {"s": "src", "rrs": "src", "rrc": "src", "rrcs": "src", "cpy": "src", "re": "src"}
WRITES = {"r": "dst", "rcs": "dst", "rrc": "dst", "rrcs": "dst", "cpy": "dst", "re": "dst"}
ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
              "outofplace", "minBytes", "maxBytes")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
              "hasdep")


def violations(text: str, runtime: str) -> list[str]:
    """Every rule of ``runtime`` (msccl, msccl-executor, rccl) the document breaks."""
    found: list[str] = []
    algo = ET.fromstring(text)
    if runtime == "msccl":
        kept = [sum(1 for _ in algo.iter())]
    else:
        gpus = algo.findall("gpu")
        kept = [1 + len(gpus) + sum(1 for _ in gpu.iter()) - 1 for gpu in gpus] or [1]
    if max(kept) > 4096:
        found.append(f"{max(kept)} elements > 4096")
    missing = [a for a in ALGO_ATTRS if algo.get(a) is None]
    if missing:
        return [f"<algo> lacks {missing}"]
    if algo.get("coll") not in COLLECTIVES[runtime]:
        found.append(f"coll {algo.get('coll')!r} unknown to {runtime}")
    if algo.get("proto") not in ("Simple", "LL", "LL128"):
        found.append(f"proto {algo.get('proto')!r}")
    nchannels = int(algo.get("nchannels"))
    if not 1 <= nchannels <= 32:
        found.append(f"nchannels {nchannels} outside 1..32")
    max_bytes, s_chunks_any = int(algo.get("maxBytes")), False
    gpus = algo.findall("gpu")
    if len(gpus) != int(algo.get("ngpus")) or len(gpus) > 1024:
        found.append(f"{len(gpus)} gpus for ngpus={algo.get('ngpus')}")
    for gpu in gpus:
        sizes = {"i": int(gpu.get("i_chunks")), "o": int(gpu.get("o_chunks")),
                 "s": int(gpu.get("s_chunks"))}
        s_chunks_any |= sizes["s"] > 0
        found += _gpu(gpu, sizes, runtime, nchannels)
    if max_bytes >= 2**62 or (runtime == "msccl" and s_chunks_any and max_bytes <= 0):
        found.append(f"maxBytes {max_bytes} is no size to allocate scratch for")
    return found


def _gpu(gpu: ET.Element, sizes: dict[str, int], runtime: str, nchannels: int) -> list[str]:
    found: list[str] = []
    rank = gpu.get("id")
    tbs = gpu.findall("tb")
    if len(tbs) > min(LIMITS[runtime]["tbs"], 1024):
        found.append(f"gpu {rank}: {len(tbs)} threadblocks > {LIMITS[runtime]['tbs']}")
    if [int(tb.get("id")) for tb in tbs] != list(range(len(tbs))):
        found.append(f"gpu {rank}: threadblock ids not 0..{len(tbs) - 1}")
    owners: set[tuple[str, str, str]] = set()
    steps_of = [tb.findall("step") for tb in tbs]
    for tb, steps in zip(tbs, steps_of, strict=True):
        where = f"gpu {rank} tb {tb.get('id')}"
        chan = int(tb.get("chan"))
        if not 0 <= chan < nchannels:
            found.append(f"{where}: chan {chan} outside 0..{nchannels - 1}")
        for role in ("send", "recv"):
            peer = tb.get(role)
            if peer != "-1":
                if (role, peer, tb.get("chan")) in owners:
                    found.append(f"{where}: second threadblock to {role} {peer} on chan {chan}")
                owners.add((role, peer, tb.get("chan")))
        if len(steps) > min(LIMITS[runtime]["steps"], 1024):
            found.append(f"{where}: {len(steps)} steps > {LIMITS[runtime]['steps']}")
        for position, step in enumerate(steps):
            found += _step(step, position, where, tb, sizes, tbs, steps_of)
    return found


def _step(step, position, where, tb, sizes, tbs, steps_of) -> list[str]:
    found = []
    missing = [a for a in STEP_ATTRS if step.get(a) is None]
    if missing:
        return [f"{where} step {position}: lacks {missing}"]
    kind, here = step.get("type"), f"{where} step {position}"
    if int(step.get("s")) != position:
        found.append(f"{here}: s={step.get('s')}")
    if kind not in TYPES:
        return [*found, f"{here}: type {kind!r}"]
    cnt = int(step.get("cnt"))
    if kind != "nop" and not 1 <= cnt < 72:
        found.append(f"{here}: cnt {cnt} outside 1..71")
    if kind in SENDS and tb.get("send") == "-1":
        found.append(f"{here}: {kind} without a send peer")
    if kind in RECEIVES and tb.get("recv") == "-1":
        found.append(f"{here}: {kind} without a receive peer")
    for table in (READS, WRITES):
        side = table.get(kind)
        if side:
            buf, off = step.get(f"{side}buf"), int(step.get(f"{side}off"))
            if buf not in sizes or not 0 <= off <= off + cnt <= sizes[buf]:
                found.append(f"{here}: {side} {buf}[{off}:{off + cnt}] outside the buffer")
            if off > 32767:
                found.append(f"{here}: {side}off {off} beyond the 16-bit offset fields")
    depid, deps = int(step.get("depid")), int(step.get("deps"))
    if depid >= 0:
        if depid > 127:
            found.append(f"{here}: depid {depid} does not fit a signed byte")
        elif depid >= len(tbs) or depid == int(tb.get("id")) or not \
                0 <= deps < len(steps_of[depid]):
            found.append(f"{here}: depends on a missing step {depid}/{deps}")
        elif steps_of[depid][deps].get("hasdep") != "1":
            found.append(f"{here}: the step it depends on lacks hasdep")
    elif kind == "nop":
        found.append(f"{here}: a nop without a dependency")
    return found


def selected(text: str, count: int, elem: int) -> bool:
    """Whether msccl-executor/RCCL would pick the algorithm for a call of ``count`` elements
    of ``elem`` bytes (the scheduler's divisibility and size-range rule)."""
    algo = ET.fromstring(text)
    size = count * elem
    low, high = int(algo.get("minBytes")), int(algo.get("maxBytes"))
    return count % int(algo.get("nchunksperloop")) == 0 and low <= size and \
        (high == 0 or size <= high)

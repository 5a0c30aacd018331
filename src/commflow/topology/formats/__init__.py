"""Topology file formats: commflow JSON/YAML, NCCL topology XML, ``nvidia-smi topo -m``.

Each format module has a ``parse(text, *, name, source)``-style function returning a
:class:`~commflow.topology.graph.Topology`; :func:`commflow.topology.load` picks one.
"""

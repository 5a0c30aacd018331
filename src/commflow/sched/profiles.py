"""Layer profiles of well-known models, from their real architectures.

Each layer's parameters and forward FLOPs per sample are counted from the architecture
(ImageNet 224x224 for the CNNs; sequence length ``seq`` for the transformers; a
multiply-add is 2 FLOPs); backward is twice forward. Times are FLOPs over the
accelerator's dense peak (:mod:`commflow.plan.hardware`) times an achieved fraction
(``efficiency``; defaults: 0.25 for CNNs, 0.35 for transformers, roughly what published
V100 mixed-precision throughputs imply: ResNet-50 near 1,300 images/s, BERT-large at
sequence 128 near 200 sequences/s). Gradients are
``grad_bytes`` per parameter (4: float32 gradients).

- ``resnet50`` (torchvision v1.5: 53 convolutions with their batch norms, then the
  classifier; 25,557,032 parameters), ``vgg16`` (13 convolutions, 3 fully connected;
  138,357,544), ``bert-large`` (embeddings, 24 encoder layers, pooler and next-sentence
  head, masked-LM head; hidden 1,024, vocabulary 30,522; 336,226,108), ``gpt2`` (124 M:
  12 blocks, hidden 768) and ``gpt2-xl``
  (1.5 B: 48 blocks, hidden 1,600; vocabulary 50,257, context 1,024, tied embeddings;
  124,439,808 and 1,557,611,200 parameters).
"""

from __future__ import annotations

from collections.abc import Callable

from commflow.sched.workload import Layer, ScheduleError, Workload

Counts = list[tuple[str, float, float]]
"""(layer name, parameters, forward FLOPs per sample)."""


def _conv(name: str, cin: int, cout: int, k: int, out_hw: int, bn: bool = True) -> tuple:
    params = k * k * cin * cout + (2 * cout if bn else cout)
    return (name, params, 2.0 * k * k * cin * cout * out_hw * out_hw)


def _fc(name: str, fin: int, fout: int) -> tuple:
    return (name, fin * fout + fout, 2.0 * fin * fout)


def resnet50(_: int) -> Counts:
    """ResNet-50 v1.5 (stride on the 3x3 convolution)."""
    layers = [_conv("conv1", 3, 64, 7, 112)]
    cin, hw = 64, 56
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for b in range(blocks):
            out_hw = hw // 2 if stage and b == 0 else hw
            tag = f"s{stage + 1}b{b + 1}"
            layers += [_conv(f"{tag}.conv1", cin, width, 1, hw),
                       _conv(f"{tag}.conv2", width, width, 3, out_hw),
                       _conv(f"{tag}.conv3", width, 4 * width, 1, out_hw)]
            if b == 0:
                layers.append(_conv(f"{tag}.down", cin, 4 * width, 1, out_hw))
            cin, hw = 4 * width, out_hw
    return [*layers, _fc("fc", 2048, 1000)]


def vgg16(_: int) -> Counts:
    """VGG-16 (configuration D, no batch norm)."""
    plan = ((64, 2, 224), (128, 2, 112), (256, 3, 56), (512, 3, 28), (512, 3, 14))
    layers, cin = [], 3
    for block, (cout, convs, hw) in enumerate(plan):
        for c in range(convs):
            layers.append(_conv(f"conv{block + 1}_{c + 1}", cin, cout, 3, hw, bn=False))
            cin = cout
    return [*layers, _fc("fc6", 512 * 7 * 7, 4096), _fc("fc7", 4096, 4096),
            _fc("fc8", 4096, 1000)]


def _encoder(name: str, h: int, seq: int) -> tuple:
    """One transformer block: attention (QKV, output) and a 4h MLP with two layer norms."""
    params = 12 * h * h + 13 * h
    flops = seq * (2.0 * 12 * h * h + 4.0 * seq * h)
    return (name, params, flops)


def bert_large(seq: int) -> Counts:
    """BERT-large for pre-training (word, position, type embeddings; masked-LM head whose
    decoder shares the word embeddings)."""
    h, vocab = 1024, 30522
    layers = [("embeddings", (vocab + 512 + 2) * h + 2 * h, 0.0)]
    layers += [_encoder(f"layer{i}", h, seq) for i in range(24)]
    layers += [("pooler+nsp", h * h + h + 2 * h + 2, 2.0 * h * h),
               ("mlm_head", h * h + 3 * h + vocab, seq * 2.0 * (h * h + h * vocab))]
    return layers


def _gpt2(blocks: int, h: int) -> Callable[[int], Counts]:
    def counts(seq: int) -> Counts:
        vocab = 50257
        layers = [("embeddings", (vocab + 1024) * h, 0.0)]
        layers += [_encoder(f"h{i}", h, seq) for i in range(blocks)]
        return [*layers, ("ln_f+lm_head", 2 * h, seq * 2.0 * h * vocab)]
    return counts


PROFILES: dict[str, tuple[Callable[[int], Counts], int, int, float]] = {
    "resnet50": (resnet50, 64, 0, 0.25),
    "vgg16": (vgg16, 32, 0, 0.25),
    "bert-large": (bert_large, 32, 128, 0.35),
    "gpt2": (_gpt2(12, 768), 8, 1024, 0.35),
    "gpt2-xl": (_gpt2(48, 1600), 2, 1024, 0.35),
}
"""name: (layer counts, default batch per worker, default sequence length, efficiency)."""


def profile(name: str, *, batch: int | None = None, seq: int | None = None,
            accelerator: str = "v100", precision: str = "fp16",
            efficiency: float | None = None, grad_bytes: float = 4.0) -> Workload:
    """The :class:`Workload` of model ``name`` (see the module docstring) for ``batch``
    samples per worker on ``accelerator``.

    Raises ``ScheduleError`` for an unknown model or non-positive batch, sequence or
    efficiency; ``CommflowError`` for an unknown accelerator or precision.
    """
    from commflow.plan.hardware import get_accelerator

    if name not in PROFILES:
        raise ScheduleError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}")
    counts, default_batch, default_seq, default_eff = PROFILES[name]
    batch = default_batch if batch is None else batch
    seq = default_seq if seq is None else seq
    efficiency = default_eff if efficiency is None else efficiency
    if batch < 1 or (default_seq and seq < 1) or not 0 < efficiency <= 1:
        raise ScheduleError(f"profile {name}: batch and seq must be >= 1 and efficiency in "
                            f"(0, 1] (got {batch}, {seq}, {efficiency})")
    rate = get_accelerator(accelerator).peak(precision) * efficiency
    layers = tuple(Layer(layer, batch * flops / rate, 2 * batch * flops / rate,
                         params * grad_bytes) for layer, params, flops in counts(seq))
    return Workload(name, layers)


def parameters(name: str) -> int:
    """Parameters of model ``name`` (a check on the architecture)."""
    if name not in PROFILES:
        raise ScheduleError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}")
    counts, _, seq, _ = PROFILES[name]
    return int(sum(params for _, params, _ in counts(seq or 1)))

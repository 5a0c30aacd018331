"""Both models reproduce the classic alpha-beta costs (Thakur, Rabenseifner & Gropp 2005;
REFERENCES.md) on uniform networks: ring algorithms on ``ring(p)``, the others on
``fully_connected(p)``, latency ``ALPHA`` per link, bandwidth ``1 / BETA``, reductions at
``1 / GAMMA``.

The formulas count synchronous rounds; Bruck and binomial trees on a non-power-of-two send
whatever they already hold without waiting for the round, so they beat the formula there
(checked by hand below) and the table uses powers of two for them."""

from __future__ import annotations

import math

import pytest

from commflow.algorithms import build
from commflow.sim import MODELS, simulate
from commflow.topology import fully_connected, ring

ALPHA = 2e-6
BETA = 1 / 10e9
GAMMA = 1 / 4e9
SIZES = (4096.0, 64e6)


def lg(p: int) -> int:
    return math.ceil(math.log2(p))


# (collective, algorithm, topology, rank counts, reduces, cost(p, n)); with ``reduces`` the
# simulation prices reductions at 1/GAMMA and the formula includes its gamma term.
CASES = [
    (
        "allgather",
        "ring",
        ring,
        (2, 3, 5, 8),
        False,
        lambda p, n: (p - 1) * ALPHA + (p - 1) / p * n * BETA,
    ),
    (
        "allreduce",
        "ring",
        ring,
        (2, 3, 5, 8),
        False,
        lambda p, n: 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA,
    ),
    (
        "allreduce",
        "ring",
        ring,
        (2, 4, 6),
        True,
        lambda p, n: 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA,
    ),
    (
        "reducescatter",
        "ring",
        ring,
        (2, 4, 7),
        True,
        lambda p, n: (p - 1) * ALPHA + (p - 1) / p * n * (BETA + GAMMA),
    ),
    (
        "allgather",
        "recursive_doubling",
        fully_connected,
        (2, 4, 8, 16),
        False,
        lambda p, n: lg(p) * ALPHA + (p - 1) / p * n * BETA,
    ),
    (
        "reducescatter",
        "halving_doubling",
        fully_connected,
        (2, 4, 8, 16),
        True,
        lambda p, n: lg(p) * ALPHA + (p - 1) / p * n * (BETA + GAMMA),
    ),
    (
        "allreduce",
        "halving_doubling",
        fully_connected,
        (2, 4, 8, 16),
        True,
        lambda p, n: 2 * lg(p) * ALPHA + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA,
    ),
    (
        "allgather",
        "bruck",
        fully_connected,
        (2, 4, 8, 16),
        False,
        lambda p, n: lg(p) * ALPHA + (p - 1) / p * n * BETA,
    ),
    (
        "broadcast",
        "binomial_tree",
        fully_connected,
        (2, 4, 8, 16),
        False,
        lambda p, n: lg(p) * (ALPHA + n * BETA),
    ),
]


def expand(cases):
    for collective, name, topology, ranks, reduces, cost in cases:
        for p in ranks:
            yield pytest.param(
                collective,
                name,
                topology,
                p,
                reduces,
                cost,
                id=f"{collective}-{name}-p{p}{'-gamma' if reduces else ''}",
            )


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("collective", "name", "topology", "p", "reduces", "cost"), list(expand(CASES))
)
def test_classic_costs(model, collective, name, topology, p, reduces, cost):
    program = build(collective, name, p)
    network = topology(p, bandwidth=1 / BETA, latency=ALPHA)
    for n in SIZES:
        result = simulate(
            program, network, n, model=model, reduce_bandwidth=1 / GAMMA if reduces else None
        )
        assert result.time == pytest.approx(cost(p, n), rel=0.01)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("collective", "name", "p", "cost"),
    [
        ("allreduce", "ring", 4, CASES[1][5]),
        ("allgather", "ring", 6, CASES[0][5]),
        ("allgather", "bruck", 8, CASES[7][5]),
    ],
)
def test_two_channels_share_links_and_keep_the_cost(model, collective, name, p, cost):
    """With two channels every link carries two concurrent streams (the flow model's event
    loop and the alpha-beta model's wave loads); each moves half the data at half the
    bandwidth, so the cost is unchanged."""
    program = build(collective, name, p, channels=2)
    topology = ring if name == "ring" else fully_connected
    network = topology(p, bandwidth=1 / BETA, latency=ALPHA)
    for n in SIZES:
        assert simulate(program, network, n, model=model).time == pytest.approx(
            cost(p, n), rel=0.01
        )


@pytest.mark.parametrize("model", MODELS)
def test_pipelined_chain_broadcast(model):
    """Broadcast along a ring with k pipeline chunks: (p - 2 + k)(alpha + n/k beta)."""
    p, k, n = 6, 4, 8e6
    program = build("broadcast", "ring", p, chunks=k)
    result = simulate(program, ring(p, bandwidth=1 / BETA, latency=ALPHA), n, model=model)
    assert result.time == pytest.approx((p - 2 + k) * (ALPHA + n / k * BETA), rel=0.01)


@pytest.mark.parametrize("model", MODELS)
def test_bruck_on_three_ranks_sends_its_own_block_without_waiting(model):
    """Bruck, p = 3: step 0 sends the own block to r-1; step 1 sends the own block again (to
    r-2), right after the first injection. Done at ``b + (b + alpha)``, ``b = n/3 * beta``,
    one alpha less than the round formula ``2 alpha + 2/3 n beta``."""
    n = 64e6
    result = simulate(
        build("allgather", "bruck", 3),
        fully_connected(3, bandwidth=1 / BETA, latency=ALPHA),
        n,
        model=model,
    )
    assert result.time == pytest.approx(ALPHA + 2 / 3 * n * BETA, rel=1e-9)

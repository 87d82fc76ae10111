"""The layout model (analysis/model/layouts.py) against numbers worked out by hand: memory per
device of a known case byte for byte, the pipeline's bubble, the overlap rule, and rankings
that follow from the formulas whatever the machine's load (pure computation)."""

from __future__ import annotations

import pytest

from hpcbench.analysis.model import collectives as co
from hpcbench.analysis.model import layouts as lm
from hpcbench.spec.parallel import Layout

GPT2 = lm.transformer("gpt2_124m")
FREE = co.LinkCost(0.0, 0.0)
PEAK = 100e12


def machine(memory_gib: float = 1e6, intra: co.LinkCost = FREE, inter: co.LinkCost = FREE, per_node: int = 8,
            nics: int = 1) -> lm.Machine:  # fmt: skip
    return lm.Machine(per_node, intra, inter, memory_gib * lm.GIB, nics, peak_flops=PEAK, efficiency=0.5)


def test_gpt2_124m_is_read_from_the_zoo() -> None:
    assert GPT2.parameters == 124_439_808  # the published count
    assert (GPT2.blocks, GPT2.dim, GPT2.heads, GPT2.kv_heads, GPT2.hidden, GPT2.vocab, GPT2.tokens) == (
        12, 768, 12, 12, 3072, 50257, 1024)  # fmt: skip
    # a block: Q, K, V, O (4·768² + 4·768) and the MLP (2·768·3072 + 3072 + 768), two LayerNorms (2·1536)
    assert GPT2.block_parameters == 2_362_368 + 4_722_432 + 3_072
    assert GPT2.block_whole == 3_072 + 2 * 768  # norms and the two row-parallel biases
    assert GPT2.other == 50257 * 768 + 1024 * 768 + 2 * 768  # token and position tables, final norm
    assert lm.transformer("gpt2_124m", 512).tokens == 512


def test_memory_of_gpt2_124m_adamw_fsdp8_zero3_by_hand() -> None:
    job = lm.Job(GPT2, batch_size=4, precision="fp32", optimizer="adamw")
    mem = lm.memory(job, Layout(dp=1, fsdp=8, zero=3))
    p = 124_439_808
    assert mem.weights == 4 * p / 8  # fp32 weights, sharded (zero 3)
    assert mem.gradients == 4 * p / 8
    assert mem.optimizer == 8 * p / 8  # AdamW's two moments
    assert mem.gathered == 2 * 39_385_344 * 4  # the root unit (the tables) and a prefetched one, fp32
    # per block: S·b·D·(10 + 24 + 5·a·S/D) = 1024·4·768·(34 + 80) at 2 bytes, twice in fp32; 12 blocks;
    # the logits 4·S·b·V
    block = 1024 * 4 * 768 * (34 + 5 * 12 * 1024 / 768) * 2
    assert block == 717_225_984
    assert mem.activations == 12 * block + 4 * 1024 * 4 * 50257
    assert mem.total == 9_994_084_864
    # zero 2 keeps the weights whole and gathers nothing; bf16 adds the 2-byte copy, halves activations
    two = lm.memory(job, Layout(dp=1, fsdp=8, zero=2))
    assert (two.weights, two.gathered, two.gradients) == (4 * p, 0.0, mem.gradients)
    mixed = lm.memory(lm.Job(GPT2, 4, "bf16", "adamw"), Layout(dp=1, fsdp=8, zero=3))
    assert mixed.weights == 6 * p / 8 and mixed.activations == 12 * block / 2 + 4 * 1024 * 4 * 50257
    assert lm.memory(lm.Job(GPT2, 4, "fp32", "sgd"), Layout(dp=8)).optimizer == 0.0
    assert lm.memory(lm.Job(GPT2, 4, "fp32", "momentum"), Layout(dp=8)).optimizer == 4 * p


def test_tensor_and_pipeline_splits_of_memory() -> None:
    job = lm.Job(GPT2, 8, "bf16", "adamw")
    tp = lm.memory(job, Layout(dp=1, tp=4))
    per_device = 12 * (GPT2.block_split / 4 + GPT2.block_whole) + GPT2.other  # the tables stay whole
    assert tp.weights == 6 * per_device
    s, b, d, a = 1024, 8, 768, 12
    assert tp.activations == 12 * s * b * d * (10 + 24 / 4 + 5 * a * s / (d * 4)) + 4 * s * b * 50257
    # pp 4 of 3 blocks each, 8 micro-batches of 1: 1F1B holds 4 on the first stage, GPipe all 8
    one_f = lm.memory(job, Layout(dp=1, pp=4, microbatches=8, schedule="1f1b"))
    gpipe = lm.memory(job, Layout(dp=1, pp=4, microbatches=8, schedule="gpipe"))
    block = s * 1 * d * (34 + 5 * a * s / d)
    assert one_f.activations == max(3 * 4 * block, 3 * block + 4 * s * 50257)
    assert gpipe.activations == 3 * 8 * block
    assert one_f.weights == 6 * (3 * GPT2.block_parameters + GPT2.other)
    flash = lm.memory(lm.Job(GPT2, 8, "bf16", "adamw", flash_attention=True), Layout(dp=1))
    assert flash.activations == 12 * s * b * d * 34 + 4 * s * b * 50257


def test_bubble_fractions() -> None:
    assert lm.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert lm.bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert lm.bubble_fraction(1, 1) == 0.0
    job = lm.Job(GPT2, 8, "bf16", "adamw")
    free = machine()
    compute = GPT2.flops_per_sample * 8 / (PEAK * 0.5)
    for schedule in ("gpipe", "1f1b"):  # the same idle share, different memory
        pred = lm.predict(job, free, Layout(dp=1, pp=4, microbatches=4, schedule=schedule))
        assert pred.compute_s == pytest.approx(compute / 4)
        assert pred.bubble_s / pred.t_iter_s == pytest.approx(3 / 7)
        assert pred.t_iter_s == pytest.approx(compute / 4 * 7 / 4)
    assert lm.default_microbatches(8, 2) == 8 and lm.default_microbatches(6, 4) == 6
    assert lm.default_microbatches(12, 2) == 6 and lm.default_microbatches(8, 1) == 1


def test_overlap_one_unit_ahead_by_hand() -> None:
    # gathers: the first exposed, the second 1 s longer than the unit it hides behind
    assert lm.overlapped([1, 1, 1], [0.5, 2, 0.5], [0, 0, 0]) == pytest.approx(4.5)
    # a reduction after the first unit outlasts the rest of the compute
    assert lm.overlapped([1, 1], [0, 0], [3, 0.1]) == pytest.approx(4.1)
    assert lm.overlapped([1, 1], [0, 0], [0.5, 0.5]) == pytest.approx(2.5)  # only the last one is exposed


def test_collective_costs_on_the_level_their_groups_span() -> None:
    intra, inter = co.LinkCost(1e-6, 1e-11), co.LinkCost(1e-5, 1e-9)
    m = machine(intra=intra, inter=inter)
    tp8 = lm.span(Layout(dp=2, tp=8), "tp", 8)
    assert tp8 == lm.Span(8, True, 1)
    assert lm.allreduce_cost(1e6, tp8, m) == pytest.approx(co.ring_allreduce(1e6, 8, intra))
    dp2 = lm.span(Layout(dp=2, tp=8), "dp", 8)  # 8 groups {r, r + 8} cross the node's one adapter
    assert dp2 == lm.Span(2, False, 8)
    assert lm.allreduce_cost(1e6, dp2, m) == pytest.approx(2 * 1e-5 + 2 * 1e6 / 2 * 1e-9 * 8)
    four_nics = machine(intra=intra, inter=inter, nics=4)
    assert lm.allreduce_cost(1e6, dp2, four_nics) == pytest.approx(2 * 1e-5 + 1e6 * 1e-9 * 2)
    fsdp16 = lm.span(Layout(dp=1, fsdp=16), "fsdp", 8)  # one group over both nodes: a flat ring
    assert fsdp16 == lm.Span(16, False, 1)
    assert lm.gather_cost(16e6, fsdp16, m) == pytest.approx(15 * 1e-5 + 16e6 * 15 / 16 * 1e-9)
    assert lm.send_cost(4e6, lm.span(Layout(dp=1, pp=2, tp=8), "pp", 8), m) == pytest.approx(1e-5 + 4e6 * 1e-9 * 8)


def test_free_links_leave_only_the_compute_and_the_bubble() -> None:
    job = lm.Job(GPT2, 8, "bf16", "adamw")
    table = lm.rank(job, machine(), [2])
    ideal = 16 * PEAK * 0.5 / GPT2.flops_per_sample * 1024  # tokens/s of 16 devices at half the peak
    flat = table[table["pp"] == 1]
    assert len(flat) > 10 and flat["tokens_per_s"].to_numpy() == pytest.approx(ideal)
    piped = table[table["pp"] > 1]
    assert (piped["tokens_per_s"] < ideal * (1 - 1e-9)).all()
    assert piped["tokens_per_s"].to_numpy() == pytest.approx(ideal * (1 - piped["bubble"].to_numpy()))


def test_rankings_that_follow_from_the_formulas() -> None:
    job = lm.Job(GPT2, 8, "bf16", "adamw")
    slow_network = machine(intra=co.link_from_rate(3600, 3), inter=co.link_from_rate(25, 10))

    def rate(layout: Layout) -> float:
        return lm.predict(job, slow_network, layout).tokens_per_s

    assert rate(Layout(dp=2, tp=8)) > rate(Layout(dp=1, tp=16))  # tp inside the node, not across
    assert rate(Layout(dp=2, fsdp=8, zero=2)) > rate(Layout(dp=2, fsdp=8, zero=3))  # zero 3 gathers twice
    assert rate(Layout(dp=2, fsdp=8)) > rate(Layout(dp=1, fsdp=16))  # shard inside the node
    memory = [lm.memory(job, Layout(dp=16 // f, fsdp=f)).total for f in (1, 2, 4, 8, 16)]
    assert memory == sorted(memory, reverse=True)  # more shards, less per device
    table = lm.rank(job, machine(memory_gib=8, inter=co.link_from_rate(25, 10)), [2])
    fits = table["fits"].tolist()
    assert any(fits) and not all(fits) and fits == sorted(fits, reverse=True)  # those that fit first
    for part in (table[table["fits"]], table[~table["fits"]]):
        assert part["tokens_per_s"].is_monotonic_decreasing
    assert (table[~table["fits"]]["memory_gib"] > 8).all() and (table[table["fits"]]["memory_gib"] <= 8).all()


def test_the_enumeration_keeps_what_the_model_can_split() -> None:
    found = list(lm.layouts(GPT2, 8, 16))
    assert all(layout.ranks == 16 for layout in found) and len(found) == len(set(found))
    assert {layout.tp for layout in found} == {1, 2, 4}  # 12 heads: no tp 8, no tp 16
    assert {layout.zero for layout in found if layout.fsdp > 1} == {2, 3}
    assert all(layout.microbatches == 1 for layout in found if layout.pp == 1)
    tiny = lm.transformer("gpt_tiny")
    assert max(layout.pp for layout in lm.layouts(tiny, 4, 8)) == 2  # 2 blocks
    llama = lm.transformer("llama_1b", 128)
    assert lm.problems(Layout(dp=1, tp=16), llama, 4) == ["tp 16 does not divide the 8 KV heads of llama_1b"]
    assert lm.problems(Layout(dp=1, pp=2, microbatches=3), tiny, 4) == ["3 micro-batches do not divide the batch of 4"]
    with pytest.raises(lm.LayoutError, match="no transformer blocks"):
        lm.transformer("resnet50")

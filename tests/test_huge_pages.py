"""A built model's weights move into one arena advised for huge pages: same values, same tensors, shared storage
still shared, and the arena's mapping carries the kernel's huge-page advice."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tally.layers.huge_pages import (HUGE_PAGE, MADV_HUGEPAGE, MIN_BYTES, _madvise, collapse_to_huge_pages,
                                     huge_page_buffer, mapping_fields, move_weights_to_huge_pages, thp_setting)

needs_thp = pytest.mark.skipif(thp_setting() not in ("always", "madvise"),
                               reason="this kernel gives no transparent huge pages on request")


def _huge_kb(address: int) -> int:
    return int(mapping_fields(address)["AnonHugePages"].split()[0])


def _vm_flags(address: int) -> list[str]:
    return mapping_fields(address)["VmFlags"].split()


class Weights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(300, 1000, generator=gen), requires_grad=False)
        self.register_buffer("q", torch.randint(-127, 128, (1 << 20,), dtype=torch.int8, generator=gen))
        self.register_buffer("q_tail", self.q[4096:])  # a view of q's storage
        self.register_buffer("norm", torch.ones(64))  # small: stays
        self.tied = nn.Linear(1000, 300, bias=False)
        self.tied.weight = self.weight


@needs_thp
def test_weights_move_with_their_values_identity_and_sharing():
    m = Weights()
    before = {n: t.clone() for n, t in m.state_dict().items()}
    weight, norm_ptr = m.weight, m.norm.data_ptr()
    backed = move_weights_to_huge_pages(m)
    assert 0 <= backed <= m.weight.nbytes + m.q.nbytes + 64  # what the kernel gave: not in the test's hands
    for n, t in m.state_dict().items():
        assert torch.equal(t, before[n]), n
    assert m.weight is weight and m.tied.weight is m.weight
    assert m.q_tail.data_ptr() == m.q.data_ptr() + 4096
    assert m.weight.untyped_storage().data_ptr() == m.q.untyped_storage().data_ptr()  # one arena
    assert m.norm.data_ptr() == norm_ptr
    first = min(m.weight.data_ptr(), m.q.data_ptr())
    assert first % HUGE_PAGE == 0
    assert "hg" in _vm_flags(first)


@needs_thp
def test_a_buffer_is_aligned_untouched_memory_with_the_advice():
    buf = huge_page_buffer(3 * HUGE_PAGE + 5)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * HUGE_PAGE + 5
    assert buf.data_ptr() % HUGE_PAGE == 0 and "hg" in _vm_flags(buf.data_ptr() + 3 * HUGE_PAGE)


@needs_thp
def test_a_buffer_faulted_onto_small_pages_collapses_onto_huge_ones_with_its_values():
    buf = huge_page_buffer(4 * HUGE_PAGE)
    advise = _madvise()
    assert advise(buf.data_ptr(), 4 * HUGE_PAGE, 15) == 0  # MADV_NOHUGEPAGE: the faults below take 4 KB pages
    # MADV_DONTNEED: memory the allocator hands back may already sit on huge pages, which the advice leaves in place
    assert advise(buf.data_ptr(), 4 * HUGE_PAGE, 4) == 0
    buf.copy_(torch.arange(buf.numel()).to(torch.uint8))
    if mapping_fields(buf.data_ptr())["AnonHugePages"] != "0 kB":
        pytest.skip("the buffer's mapping already holds huge pages, so there is nothing small to collapse")
    assert advise(buf.data_ptr(), 4 * HUGE_PAGE, MADV_HUGEPAGE) == 0
    before = _huge_kb(buf.data_ptr())  # the advice may merge the range into a neighbouring advised mapping
    if not collapse_to_huge_pages(buf):
        pytest.skip("this kernel cannot collapse the range now (before Linux 6.1, or no 2 MB pages to compact into)")
    assert _huge_kb(buf.data_ptr()) - before == 4 * HUGE_PAGE >> 10
    assert torch.equal(buf, torch.arange(buf.numel()).to(torch.uint8))


def test_memory_torch_did_not_allocate_and_small_tensors_stay():
    m = nn.Module()
    m.register_buffer("mapped", torch.frombuffer(bytearray(2 * MIN_BYTES), dtype=torch.uint8))
    m.register_buffer("small", torch.zeros(MIN_BYTES // 8, dtype=torch.uint8))
    ptrs = [m.mapped.data_ptr(), m.small.data_ptr()]
    assert move_weights_to_huge_pages(m) == 0
    assert [m.mapped.data_ptr(), m.small.data_ptr()] == ptrs


@needs_thp
def test_the_engine_runs_on_moved_weights_and_its_ledger_says_so(tmp_path):
    from support.tiny_models import make_checkpoint

    from tally import LLM, SamplingParams

    model_dir = make_checkpoint(tmp_path, "llama", hidden_size=128, intermediate_size=512)
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000)
    model = llm.engine.model
    assert llm.engine.ledger.huge_page_bytes == model.huge_page_bytes
    assert ("on huge pages" in llm.engine.ledger.format()) == (model.huge_page_bytes > 0)
    largest = max(model.state_dict().values(), key=lambda t: t.nbytes)
    assert "hg" in _vm_flags(largest.data_ptr())
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4

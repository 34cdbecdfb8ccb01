"""vLLM's CPU backend spreads sampling settings over draft positions wrong (vLLM issue 55005);
lookahead repairs it where it finds it broken (:mod:`lookahead_client.vllm.cpu_sampling`)."""

from __future__ import annotations

import pytest
from vllm_support import expand_as_shipped

from lookahead_client.vllm.cpu_sampling import expand_works, repair_expand


def test_the_cpu_expand_kernel_loses_its_output_until_repaired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    import vllm.v1.sample.rejection_sampler as sampler
    from vllm.platforms import current_platform

    expand_as_shipped(monkeypatch)
    current_platform.register_triton_kernel_overrides()  # as a worker does at start
    assert not expand_works(), "vLLM's CPU expand_kernel works: the repair is not needed"
    assert repair_expand() and expand_works()
    # the greedy marker is replaced, every request's positions get its value, in float
    temperature = torch.tensor([0.7, -1.0, 1.3])
    ends = torch.tensor([2, 3, 6], dtype=torch.int32)
    got = sampler.expand_batch_to_tokens(temperature, ends, 6, replace_from=-1, replace_to=1)
    assert got.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.3, 1.3, 1.3])
    assert repair_expand()  # a working kernel is left alone

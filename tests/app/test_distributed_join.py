"""Shard.join's device branches, run on a CPU: the CUDA branch up to the first real CUDA call, with
a stand-in for each call a CUDA machine would make (its device, NCCL's group, the gloo group for
control messages)."""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from pope_fast import distributed
from pope_fast.distributed import Shard


@pytest.fixture
def calls(monkeypatch):
    """What join asks of torch.cuda and torch.distributed, recorded instead of done."""
    made = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: made.append(("set_device", str(device))))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, timeout: made.append(("init_process_group", backend,
                                                              timeout)))
    monkeypatch.setattr(dist, "new_group", lambda backend, timeout:
                        made.append(("new_group", backend)) or "gloo-group")

    monkeypatch.setenv(distributed.TIMEOUT_ENV, "90")
    return made


@pytest.mark.parametrize("device, expected", [("cuda", "cuda:3"), ("cuda:1", "cuda:1")])
def test_on_cuda_a_rank_takes_its_device_then_nccl_with_a_gloo_group_beside(calls, device,
                                                                            expected):

    shard = Shard(rank=5, world_size=8, local_rank=3)
    shard.join(device)
    assert calls == [("set_device", expected),
                     ("init_process_group", "nccl", timedelta(seconds=90)), ("new_group", "gloo")]
    assert shard.group == "gloo-group" and shard.timeout == timedelta(seconds=90)


def test_on_cpu_a_rank_joins_gloo_and_sends_control_messages_through_it(calls):
    shard = Shard(rank=1, world_size=2, local_rank=1)
    shard.join("cpu")
    assert calls == [("init_process_group", "gloo", timedelta(seconds=90))]
    assert shard.group is dist.group.WORLD

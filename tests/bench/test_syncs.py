"""The sweep's synchronisation count (bench/syncs.py): what it counts as a wait on the device,
on the CPU."""
import torch

from pope_fast.bench.syncs import SyncCounter
from pope_fast.engine.inputs.plan import to_device


def test_the_counter_tells_host_tensors_from_the_devices_and_counts_what_would_wait():
    cpu = torch.device("cpu")
    with SyncCounter(cpu) as counter:
        host = torch.tensor([3, 1, 2])  # made without a device: the host's
        host.tolist(), int(host[0])  # reading the host's own tensor waits for nothing
        blocking = host.to(cpu)  # the device's now
        (blocking + 1).tolist()
        pinned = to_device(host, cpu)  # non-blocking: the host goes on
        bool(pinned.sum() > 0)
        torch.tensor([1.0], device=cpu)
        mask = blocking > 1
        # a device mask's shape is the device's to tell; a host mask's is not
        blocking[mask], host[host > 1]
        weights = torch.ones(3) * 2  # still the host's, made from a host tensor
    counts = {kind: n for (phase, kind), n in counter.counts.items() if phase == "between"}
    assert (counts["reads_back"] == 2 and counts["copies_to_device"] == 2
            and counts["masked_indexing"] == 1)
    assert counts["non_blocking_copies"] == 1
    # the + 1, the sum, the comparisons, the indexing: never the host's ops
    assert counts["device_calls"] >= 4
    assert (counter.host(weights) and counter.host(host) and not counter.host(blocking)
            and not counter.host(pinned))


def test_on_cuda_where_a_tensor_lives_decides():
    counter = SyncCounter(torch.device("cuda", 0))
    assert counter.host(torch.zeros(1))
    # a CPU tensor read: no wait
    assert counter.kind(torch.Tensor.tolist, (torch.zeros(1),), {}, []) is None
    assert counter.kind(torch.Tensor.to, (torch.zeros(1), "cuda"), {}, []) == "copies_to_device"
    assert counter.kind(torch.Tensor.to, (torch.zeros(1), "cuda"),
                        {"non_blocking": True}, []) == "non_blocking_copies"


def test_the_counter_counts_the_bytes_each_copy_moves_in_the_dtype_it_arrives_in():
    cpu = torch.device("cpu")
    with SyncCounter(cpu) as counter:
        codes = torch.zeros(3, 4, 5, dtype=torch.uint8)
        codes.to(cpu, torch.float16)  # 60 values, cast on the host, then 2 bytes each
        to_device(codes, cpu)  # 60 bytes, non-blocking
        torch.tensor([1, 2], device=cpu)  # two int64s
        codes.float()  # no copy
    assert counter.counts["between", "bytes_to_device"] == 120 + 60 + 16

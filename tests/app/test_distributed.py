"""Scale-out with torchrun: sharding, parts, the merge and resume, on CPU with gloo.

The process tests launch `python -m torch.distributed.run --nproc-per-node N -m pope_fast
eval` on the built-in tiny LLaVA (fp32) and compare with a single process run byte for byte; the
rest test the pieces without processes."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torchrunjobs import launch, make_job, run, run_here, same_folder


from pope_fast.distributed import RankError, Shard, assign_steps
from pope_fast.engine.inputs.vision_cache import VisionCache
from pope_fast.progress import RecordCount
from pope_fast.readout import Question, make_record
from pope_fast.readout.records import part_name
from pope_fast.store import fold_parts, order_records
from pope_fast.sweep import canonical_order

pytestmark = pytest.mark.slow  # eval and score end to end on tiny checkpoints


def _engine(image_batch: int):
    """What Shard.share asks of an engine: prompts, their token counts, vision tokens."""
    model = SimpleNamespace(preprocess=lambda image: image.size, vision_tokens=lambda size: 100,
                            tokenizer=lambda text: {"input_ids": text.split()})
    return SimpleNamespace(settings=SimpleNamespace(image_batch=image_batch),
                           prompt=lambda q: f"USER: {q}", model=model)


def _pope_like(images: int) -> list[Question]:
    """Two splits asking overlapping questions of the same images, some images asked more than
    others."""
    out = []
    for split in ("popular", "adversarial"):
        for i in range(images):
            for j in range(2 + i % 3):
                text = f"Is there object {j if split == 'popular' else j + i % 2} in the image?"
                out.append(Question(len(out) + 1, f"img{i:03d}.jpg", text,
                                    "yes" if j % 2 == 0 else "no", split))
    return out


def test_assign_steps_is_costliest_first_to_the_least_loaded_rank():
    # sorted: 5 (0) → r0; 3 (1) → r1; 3 (2) → r1 (3 < 5); 2 (3) → r0 (5 < 6); 2 (4) → r1 (6 < 7);
    # 1 (5) → r0
    assert assign_steps([5, 3, 3, 2, 2, 1], 2) == [0, 1, 1, 0, 1, 0]
    assert assign_steps([1, 1, 1], 5) == [0, 1, 2]


@pytest.mark.parametrize("world,image_batch", [(1, 8), (2, 3), (3, 2), (4, 1), (7, 2)])
def test_share_gives_each_step_to_one_rank_in_order_and_balanced(world, image_batch):
    questions, engine = _pope_like(23), _engine(image_batch)
    names = list(dict.fromkeys(q.image for q in questions))
    steps = [names[i:i + image_batch] for i in range(0, len(names), image_batch)]
    shares = [Shard(rank, world, rank).share(steps, questions, engine) for rank in range(world)]
    # each once
    assert sorted(map(tuple, (s for share in shares for s in share))) == sorted(map(tuple, steps))
    for share in shares:
        assert share == [s for s in steps if s in share]  # in their order
    # balanced: no rank carries more than one step's cost beyond the least loaded
    cost = {name: 100 + sum(len(p.split())
                            for p in {f"USER: {q.text}" for q in questions if q.image == name})
            for name in names}
    loads = [sum(cost[n] for s in share for n in s) for share in shares]
    assert max(loads) - min(loads) <= max(sum(cost[n] for n in s) for s in steps)
    assert shares == [Shard(rank, world, rank).share(steps, questions, engine)
                      for rank in range(world)]


def _record(qid: int, split: str = "demo", **fields) -> dict:
    return make_record(Question(qid, f"img{qid}.jpg", f"question {qid}", "yes", split),
                       "llava_plain", first_token_id=1, candidate_logits={1: 0.5 + qid},
                       predictions={"legacy_2tok": "yes"}, **fields)


def _line(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False) + "\n"


def test_fold_parts_adds_each_record_once_and_drops_a_torn_tail(tmp_path):
    a, b, c, d = (_record(i) for i in range(4))
    (tmp_path / "records.jsonl").write_text(_line(a) + _line(b))
    # rank 0's part still holds b (a fold that stopped before removing the parts), rank 1 was killed
    # mid-line
    (tmp_path / part_name(0)).write_text(_line(b) + _line(c))
    (tmp_path / part_name(1)).write_text(_line(d) + _line(_record(9))[:40])
    assert fold_parts(tmp_path) == 2
    assert (tmp_path / "records.jsonl").read_text() == _line(a) + _line(b) + _line(c) + _line(d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]
    assert fold_parts(tmp_path) == 0


def test_fold_parts_names_a_bad_line_of_a_part(tmp_path):
    (tmp_path / part_name(3)).write_text("{not json\n" + _line(_record(1)))
    with pytest.raises(Exception, match=r"records\.rank3\.jsonl:1: not a pope-fast record"):
        fold_parts(tmp_path)
    assert (tmp_path / part_name(3)).exists()  # nothing lost


def test_order_records_puts_lines_in_the_canonical_order(tmp_path):
    error = _record(2, error="img2.jpg: truncated")
    retry, one, other = _record(2), _record(1), _record(7, split="random")
    failing = [_record(3, error="img3.jpg: missing"), _record(3, error="img3.jpg: still missing")]
    path = tmp_path / "records.jsonl"
    path.write_text(_line(error) + _line(failing[0]) + _line(one) + _line(other) + _line(retry)
                    + _line(failing[1]))
    order = {("", "demo", "1"): 0, ("", "demo", "2"): 1, ("", "demo", "3"): 2}
    assert order_records(tmp_path, order)
    # another split's record first, as it was; a retried question keeps its answer alone, a failing
    # one its last error: the file a run with nothing to retry writes
    assert path.read_text() == _line(other) + _line(one) + _line(retry) + _line(failing[1])
    inode = path.stat().st_ino
    # in order: not rewritten
    assert not order_records(tmp_path, order) and path.stat().st_ino == inode


def test_canonical_order_is_image_then_prompt_then_question():
    ask = [Question(1, "A.jpg", "x?", "yes", "popular"),
           Question(2, "B.jpg", "x?", "no", "popular"),
           Question(1, "A.jpg", "y?", "no", "adversarial"),
           Question(3, "A.jpg", "x?", "yes", "adversarial")]
    order = canonical_order(ask, lambda text: f"USER: {text}")
    keys = sorted(order, key=order.get)
    assert keys == [("", "popular", "1"), ("", "adversarial", "3"), ("", "adversarial", "1"),
                    ("", "popular", "2")]


def test_a_ranks_writer_reads_the_merged_records_and_writes_its_part(tmp_path):
    (tmp_path / "records.jsonl").write_text(_line(_record(1)))
    with Shard(2, 3, 0).writer(tmp_path) as writer:
        assert set(writer.done) == {("", "demo", "1")}
        writer.write([_record(5)])
    assert (tmp_path / "records.jsonl").read_text() == _line(_record(1))
    assert (tmp_path / part_name(2)).read_text() == _line(_record(5))


def test_record_count_follows_parts_and_a_replaced_file(tmp_path):
    count = RecordCount(tmp_path)
    assert count() == 0
    (tmp_path / part_name(0)).write_text(_line(_record(1)))
    (tmp_path / part_name(1)).write_text(_line(_record(2)) + _line(_record(3)))
    assert count() == 3
    with open(tmp_path / part_name(1), "a") as f:
        f.write(_line(_record(4)))
    assert count() == 4
    fold_parts(tmp_path)
    assert count() == 4
    # a new file: counted afresh
    order_records(tmp_path, {("", "demo", str(i)): 5 - i for i in range(1, 5)})
    assert count() == 4


@pytest.fixture
def alone():
    """A process group of one (gloo, in this process): the collectives run without launching
    anything."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Shard(0, 1, 0, group=dist.group.WORLD)
    dist.destroy_process_group()


def test_begin_and_merge_leave_one_whole_records_file(alone, tmp_path):
    # a crash mid-line
    (tmp_path / "records.jsonl").write_text(_line(_record(1)) + _line(_record(2))[:30])
    alone.begin(tmp_path)
    assert (tmp_path / "records.jsonl").read_text() == _line(_record(1))
    (tmp_path / part_name(4)).write_text(_line(_record(3)))  # left by a job of five ranks
    alone.begin(tmp_path)
    assert (tmp_path / "records.jsonl").read_text() == _line(_record(1)) + _line(_record(3))
    with alone.writer(tmp_path) as writer:
        assert set(writer.done) == {("", "demo", "1"), ("", "demo", "3")}
        writer.write([_record(2)])
    assert alone.merge(tmp_path, (1, 0)) == (1, 0)
    assert (tmp_path / "records.jsonl").read_text() == "".join(_line(_record(i)) for i in (1, 3, 2))
    assert not list(tmp_path.glob("records.rank*"))


def test_agree_names_the_rank_that_failed(alone):
    alone.agree(None)
    with pytest.raises(RankError, match=r"^rank 0 of 1: no such checkpoint$"):
        alone.agree(ValueError("no such checkpoint"))


# A job of one rank, joined as torchrun's environment says, that imports torch.distributed.nn while
# its group is up (as transformers does loading some models), then leaves: the native threads it has
# after.
LEAVER = """
import glob
from pope_fast.distributed import join_job
shard = join_job("cpu")
import torch.distributed.nn
shard.leave()
print(sorted({open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm")}))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                    reason="reads the process's threads from /proc")
def test_leave_stops_the_groups_threads_before_the_interpreter_exits():
    """torch.distributed.nn's defaults would hold the group past destroy_process_group, and its gloo
    threads would then be torn down by the interpreter's exit, which aborted a rank now and then."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    result = subprocess.run([sys.executable, "-c", LEAVER], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    threads = result.stdout.strip()
    assert "gloo" not in threads and "tcpstore" not in threads, threads


# A rank's cache traffic: put every key, and read back another whenever it is on disk. The child
# runs vision_cache.py alone (it imports nothing of ours), sparing each the engine's seconds of
# imports.
WRITER = """
import sys, torch
from pope_fast.engine.inputs.vision_cache import VisionCache
cache, seed = VisionCache(sys.argv[1], max_in_memory=1), int(sys.argv[2])
expected = lambda k: torch.arange(20000, dtype=torch.float32).reshape(400, 50) + k
for _ in range(15):
    for k in range(12):
        cache.put(f"key{k:02d}", expected(k))
        other = (k + seed) % 12
        if cache.contains(f"key{other:02d}"):
            assert torch.equal(cache.get(f"key{other:02d}", torch.device("cpu")),
                               expected(other)), other
"""


def test_two_processes_writing_the_same_cache_keys(tmp_path):
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(seed)],
                                stderr=subprocess.PIPE, text=True) for seed in (0, 5)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    # one entry per key, no temporary file left, each entry whole and right
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"key{k:02d}.safetensors"
                                                          for k in range(12)]
    cache = VisionCache(tmp_path)
    for k in range(12):
        features = cache.get(f"key{k:02d}", torch.device("cpu"))
        assert torch.equal(features, torch.arange(20000, dtype=torch.float32).reshape(400, 50) + k)


# --- whole jobs under torchrun (their faults: test_distributed_faults.py, a module of its own so
# that the two groups of process tests run on two workers) ----------------------------------------

@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_job(tmp_path_factory)


@pytest.mark.slow
def test_bench_under_torchrun_times_each_rank(job):
    """bench on two ranks: each rank's questions and time, the sweep's time the slowest rank's.
    (Two ranks' eval is a single process's, byte for byte: the paired run below, and the resumes of
    test_distributed_faults.)"""
    bench = launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", "-m", "pope_fast", "bench", "--models", "llava",
                    "--questions", "120", "--no-reference", "--format", "json"], job.root)
    assert bench.returncode == 0, bench.stderr
    ours = json.loads(bench.stdout)["models"]["llava"]["pope_fast"]  # printed once, by rank 0
    ranks = ours["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["questions"] for r in ranks), ranks
    assert sum(r["questions"] for r in ranks) == ours["questions"] == 120
    assert ours["wall_s"] == max(r["wall_s"] for r in ranks), ours
    assert ours["questions_per_s"] == pytest.approx(120 / ours["wall_s"], rel=0.02), ours


@pytest.mark.slow
def test_a_paired_methods_run_on_two_ranks_is_the_single_process_run(job):
    """Every method's folder (and the comparison) as one process writes them: an image's prompts of
    every method on one rank."""
    paired = SimpleNamespace(root=job.root,
                             args=job.args + ["--readouts", "template_aware,legacy_2tok",
                                              "--method", "none", "--method", "vcd"])
    single, two = job.root / "paired-single", job.root / "paired-two"
    for result in (run_here(paired, single), run(paired, 2, two)):
        assert result.returncode == 0, result.stderr
    assert "36 unique prompts evaluated for 36 questions on 2 ranks" in result.stdout
    assert result.stdout.count("records, meta and summaries in") == 1  # rank 0 alone reports
    for method in ("none", "vcd"):
        same_folder(two / method, single / method)
    compared = [(out / "compare.json").read_text().replace(str(out), "RUN")
                for out in (single, two)]
    assert compared[0] == compared[1] and '"delta_f1"' in compared[0]

"""Built-in data and the machinery of random checkpoints, so the main job, the benchmark and the
tests run on a fresh machine with nothing downloaded: deterministic synthetic images, POPE-shaped
question sets, word-level stand-in tokenizers, and the writers of random checkpoints (a
transformers class saved with random weights, or random tensors streamed shard by shard).

Each family's random checkpoints live in this package's module of its model_type (llava.py for
`llava`, ...): SIZES, the shapes by name ("tiny", and "7b" for the seed model's), and
write_checkpoint; `family_checkpoints` finds that module by the convention, importing it only
when it is asked for."""
from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...readout.data import Question

COCO_CATEGORIES = tuple(w.replace("_", " ") for w in (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant "
    "stop_sign parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe "
    "backpack umbrella handbag tie suitcase frisbee skis snowboard sports_ball kite baseball_bat "
    "baseball_glove skateboard surfboard tennis_racket bottle wine_glass cup fork knife spoon bowl "
    "banana apple sandwich orange broccoli carrot hot_dog pizza donut cake chair couch "
    "potted_plant bed dining_table toilet tv laptop mouse remote keyboard cell_phone microwave "
    "oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier toothbrush"
).split())

# The language model most seed families share: LLaMA-2-7B / Vicuna-7B, and the tiny widths of the
# random checkpoints that stand for it (vocabulary padded to 32,064 rows as llava-hf's).
LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                rms_norm_eps=1e-5, max_position_embeddings=4096)
LLAMA_TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=32064,
                  rms_norm_eps=1e-5, max_position_embeddings=4096)


# Random checkpoints of models the engine has no family for, which the transformers backend runs
# (its tests, and bench --models NAME): one module each, named as the families' are (BLIP-2's
# model_type is "blip-2").
REFERENCE_ONLY = ("mllama", "paligemma", "blip2", "glm4v", "llava_onevision1_5", "ovis2_5")


def family_checkpoints(model_type: str):
    """The module of a family's random checkpoints: engine/synthetic/<model_type>.py (SIZES,
    write_checkpoint)."""
    return importlib.import_module(f"{__package__}.{model_type}")


def write_checkpoint(model_type: str, folder: Path, dims: str | dict = "tiny",
                     **kwargs) -> Path:
    """A random-weight checkpoint of the family of model_type: dims a SIZES name or a dict of the
    same shape; keyword arguments are the family writer's (tokenizer_dir, weights) or Weights
    fields."""
    return family_checkpoints(model_type).write_checkpoint(folder, dims, **kwargs)


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def synthetic_image(seed: int, size: tuple[int, int] = (640, 480)) -> Image.Image:
    """A deterministic RGB image with structure (gradients and noise), sized like a COCO photo."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (seed % 7 + 1)) % 256, (y * 3 + seed * 17) % 256, ((x + y) * 2) % 256],
                    axis=-1)
    noise = rng.integers(0, 60, size=(h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def image_for_name(name: str) -> Image.Image:
    """The synthetic stand-in for an image file name (e.g. a COCO name from a POPE file)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    sizes = ((640, 480), (480, 640), (640, 427), (500, 375))
    return synthetic_image(seed, sizes[seed % len(sizes)])


def write_images(folder: Path, names) -> Path:
    """A synthetic stand-in for each image name, in the name's own sub-folders (HallusionBench's
    `VS/chart/0_1.png`); none for a question asked without an image (no name), nor for a name that
    is no path inside the folder (an absolute one, or one climbing out with '..'), which the run
    then refuses naming its question."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(names):
        path = Path(name)
        if not name or path.is_absolute() or ".." in path.parts or (folder / name).is_file():
            continue
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        image_for_name(name).save(folder / name, format="PNG" if name.endswith(".png") else "JPEG",
                                  quality=90)
    return folder


def builtin_questions(n_questions: int, split: str = "synthetic") -> list[Question]:
    """POPE-shaped: n/6 images × 6 questions 'Is there a/an <COCO category> in the image?',
    alternating yes/no."""
    questions = []
    for i in range(n_questions):
        image, j = divmod(i, 6)
        category = COCO_CATEGORIES[(image * 7 + j * 13) % len(COCO_CATEGORIES)]
        questions.append(Question(i + 1, f"synthetic_{image:05d}.jpg",
                                  f"Is there {article(category)} {category} in the image?",
                                  "yes" if j % 2 == 0 else "no", split))
    return questions


def write_question_file(path: Path, questions: list[Question]) -> Path:
    path.write_text("".join(json.dumps({"question_id": q.question_id, "image": q.image,
                                        "text": q.text, "label": q.label}) + "\n"
                            for q in questions))
    return path


def builtin_tokenizer(folder: Path):
    """A word-level LLaMA-like tokenizer (<unk>=0, <s>=1, </s>=2, words, then <image>, <pad>) built
    with the `tokenizers` library, for machines without a real tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "USER ASSISTANT : ? . , Answer answer yes no Yes No only or the question using a an single "
        "word phrase Is is there There in image not A chat between curious human and artificial "
        "intelligence assistant The gives helpful detailed polite answers to human's questions"
        .split())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.add_tokens(["<image>"], special_tokens=True)
    fast.add_special_tokens({"pad_token": "<pad>"})
    fast.save_pretrained(str(folder))
    return fast


def builtin_chat_tokenizer(specials: list[str], *, eos: str, pad: str, bos: str | None = None,
                           chat_template: str | None = None,
                           named: dict[str, str] | None = None):
    """A word-level stand-in for the tokenizer of a model the engine has no family for (the
    transformers backend's checkpoints): COCO's words and the prompts', then `specials` (its
    image, turn and padding tokens), BOS prepended where it has one, its chat template's shape
    where it has one, and `named` special tokens as attributes (tokenizer_config.json's
    extra_special_tokens, which processors read the image tokens from). Returned unsaved: its
    processor saves it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {w for c in COCO_CATEGORIES for w in c.split()} | set(
        "system user assistant User Assistant Question Answer answer : ? . , yes no Yes No only or "
        "Is is there in the image a an en".split())
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(dict.fromkeys([*([bos] if bos else []), eos, pad, *specials])))
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token=bos,
                                   eos_token=eos, pad_token=pad, extra_special_tokens=named)
    if chat_template:
        fast.chat_template = chat_template
    return fast


def stand_in_only(tokenizer_dir: Path | None, module: str) -> None:
    """The transformers backend's random checkpoints take their built-in tokenizer alone: a real
    one lacks the stand-in vocabulary's sizes and the processor's special tokens, which the writer
    sets together."""
    if tokenizer_dir is not None:
        raise ValueError(f"--tokenizer {tokenizer_dir}: {module.rpartition('.')[2]}'s random "
                         "checkpoints use their built-in stand-in tokenizer (give a real "
                         "checkpoint with --model NAME=DIR instead)")


def builtin_bert_tokenizer(folder: Path):
    """A word-level BERT-like tokenizer ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, lowercased
    words), standing in for bert-base-uncased on machines without it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {w.lower() for c in COCO_CATEGORIES for w in c.split()} | set(
        "question answer yes no only or the is there a an in image ? . : ,".split())
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4,
             **{w: i + 5 for i, w in enumerate(sorted(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    fast.save_pretrained(str(folder))
    return fast


def tokenizer_for(folder: Path, tokenizer_dir: Path | None, builtin=builtin_tokenizer):
    """tokenizer_dir's tokenizer (a real one), else the built-in stand-in, saved into the
    checkpoint folder."""
    from transformers import AutoTokenizer

    if tokenizer_dir is None:
        return builtin(folder)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tok.save_pretrained(str(folder))
    return tok


def _random_tensor(name: str, shape, std: float, generator: torch.Generator, dtype,
                   device) -> torch.Tensor:
    # LayerNorm, layrnorm, norm, ffn_ln
    norm = "norm" in name.lower() or name.endswith("_ln.weight")
    if len(shape) == 1 and norm and name.endswith("weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=dtype, device=device)
    return (torch.randn(shape, generator=generator, device=device) * std).to(dtype)


@dataclass
class Weights:
    """How a builder fills a checkpoint. "stream" (the demo and bench): random tensors written
    shard by shard, so a 7B checkpoint never sits in memory; norms one, biases zero, the rest
    N(0, std). "model" (the tests): the transformers class built under `seed`, then every
    parameter whose rank is in `spread_ranks` drawn from N(0, std), then `extra` parameters from
    N(0, their std); saved with save_pretrained (generation_config included)."""

    init: str = "stream"
    seed: int = 0
    std: float = 0.02
    dtype: torch.dtype = torch.float16
    device: str = "cpu"
    shard_bytes: int = 2 << 30
    spread_ranks: tuple[int, ...] = (2,)
    extra: dict[str, float] = field(default_factory=dict)


def sized(table: dict, dims: str | dict) -> dict:
    """dims itself (a dict of a checkpoint's shape) or the table's entry of that name."""
    if isinstance(dims, dict):
        return dims
    if dims not in table:
        raise ValueError(f"size must be one of {', '.join(table)}")
    return table[dims]


def checkpoint_folder(folder: Path) -> Path:
    """The folder a checkpoint is written to, created."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def with_vocab(text: dict, tok) -> dict:
    """The text config with at least one lm_head row per token (the tables pad LLaMA's to 32,064, as
    llava-hf does, so the legacy readouts' fixed ids are rows whichever tokenizer stands in)."""
    return dict(text, vocab_size=max(text["vocab_size"], len(tok)))


def save_checkpoint(folder: Path, config, model_class, processor, weights: Weights) -> Path:
    # "stream": transformers' own tensor names, shard by shard: a 7B model never sits in memory
    if weights.init == "stream":
        with torch.device("meta"):
            model = model_class(config)
        # a weight tied to an earlier one (lm_head to the embeddings, where the config ties them)
        # is not stored, as save_pretrained and the published checkpoints store none: one stored
        # with other values, transformers keeps untied and warns of it on every load
        first: dict[int, str] = {}
        tied = {n for n, p in model.named_parameters(remove_duplicate=False)
                if first.setdefault(id(p), n) != n}
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
                  if not k.endswith("position_ids") and k not in tied}
        write_tensors(folder, shapes, weights)
        config.save_pretrained(str(folder))
    elif weights.init == "model":
        torch.manual_seed(weights.seed)
        model = model_class(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() in weights.spread_ranks:
                    p.normal_(0.0, weights.std)
            for name, std in weights.extra.items():
                model.get_parameter(name).normal_(0.0, std)
        model.to(weights.dtype).save_pretrained(str(folder))
    else:
        raise ValueError(f"init must be stream or model, not {weights.init!r}")
    processor.save_pretrained(str(folder))
    return folder


def write_tensors(folder: Path, shapes: dict[str, tuple[int, ...]], weights: Weights) -> None:
    """Random tensors of these names and shapes as safetensors shards (with an index when more
    than one)."""
    from safetensors.torch import save_file

    generator = torch.Generator(device=weights.device).manual_seed(weights.seed)
    shards, current, current_bytes = [], {}, 0
    for name, shape in shapes.items():
        current[name] = _random_tensor(name, shape, weights.std, generator, weights.dtype,
                                       weights.device).cpu()
        current_bytes += current[name].numel() * current[name].element_size()
        if current_bytes >= weights.shard_bytes:
            shards.append(current)
            current, current_bytes = {}, 0
    if current:
        shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = (f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
                 else "model.safetensors")
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    if len(shards) > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

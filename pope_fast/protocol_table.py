"""`pope-fast protocols`: each published protocol (readout/protocols/<tool>.py) with its sources,
its answer rule and aggregation, and per family the tool's model class, prompt and length, or why
the tool has none."""
from __future__ import annotations

from .engine.models import FAMILIES, family_class
from .readout.protocols import PROTOCOLS, Protocol, coverage, get_template
from .readout.templates import SAMPLE_QUESTION

# How the listing names each Settings.image_reencode (engine/inputs/images.py reencoded)
IMAGE_STEP = {"none": "", "rgb": ", PIL convert('RGB') first",
              "load_image": ", opened as transformers' load_image", "jpeg85": ", re-encoded jpeg85"}


def describe_protocols(tokenizer=None) -> str:
    """The listing; chat prompts rendered with `tokenizer`'s chat template where one is given, else
    described as the messages the template receives."""
    return "\n\n".join(_describe(p, tokenizer) for p in PROTOCOLS.values())


def _describe(protocol: Protocol, tokenizer) -> str:
    unknown = "counted as no" if protocol.unknown_is_no else "left out of the confusion counts"
    unknown = "counted by its label (its rule reads the label)" if protocol.counted else unknown
    lines = [f"{protocol.name}: {protocol.title} ({protocol.version})",
             f"  answer rule: {protocol.readout}; headline {protocol.headline}; "
             f"{'per split and pooled (Overall)' if protocol.pooled else 'per split'}; "
             f"an unknown answer {unknown}",
             f"  reproduces: {protocol.reproduces}",
             *[f"  source: {s}" for s in protocol.sources],
             *([f"  thinking checkpoints: {protocol.thinking}"] if protocol.thinking else [])]
    for model_type in FAMILIES:
        cls = family_class(model_type)
        for label, config in cls.protocol_variants().items():
            try:
                covered = coverage(protocol.name, cls, config)
            except ValueError as why:
                lines.append(f"  {label}: not covered: {str(why).split(': ', 1)[1]}")
                continue
            length = f"{covered.new_tokens} new tokens" if covered.new_tokens else "no generation"
            if covered.min_new_tokens:
                length += f" (at least {covered.min_new_tokens})"
            if covered.generation_config != "none":
                only_output = covered.generation_config == "greedy_output"
                length += ", the checkpoint's generation config applied" + (
                    " (over the output only)" if only_output else "")
                if covered.repetition_penalty is not None:
                    length += f" under repetition_penalty {covered.repetition_penalty:g}"
            if covered.num_beams > 1:
                length += f", {covered.num_beams} beams (length_penalty {covered.length_penalty:g})"
            if covered.do_sample:
                length += (f", sampled (temperature {covered.temperature:g}, "
                           f"top_k {covered.top_k or 'none'}, top_p "
                           f"{covered.top_p:g}; each question drawn under --seed)")
            if covered.max_length is not None:
                length += f", max_length {covered.max_length} with the prompt"
            if covered.answer_cut != "none":
                length += f", the answer cut from the whole output ({covered.answer_cut})"
            reencode = IMAGE_STEP[covered.image_reencode]
            reencode += ("" if covered.image_resize == "none"
                         else f", resized {covered.image_resize}")
            reencode += ("" if covered.processor_pixels is None
                         else f", processor pixels {covered.processor_pixels}")
            reencode += ("" if covered.processor_patches is None
                         else f", processor tiles {covered.processor_patches}")
            reencode += (", image tokens attending causally" if covered.image_mask == "causal"
                         else "")
            dtype = {None: "", "auto": ", in the checkpoint's own dtype"}.get(
                covered.dtype, f", in {covered.dtype}")
            lines.append(f"  {label}: {covered.model_class}; template {covered.template}, "
                         f"{length}, image {covered.image_aspect}{reencode}{dtype}")
            lines.append(f"    prompt: {_prompt(covered.template, tokenizer)}")
            lines += [f"    not reproduced: {d}" for d in covered.deviations]
    return "\n".join(lines)


def _prompt(name: str, tokenizer) -> str:
    template = get_template(name)
    if not template.chat:
        return repr(template.render(SAMPLE_QUESTION))
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return repr(template.render(SAMPLE_QUESTION, tokenizer))
    system = (f"system {template.system!r}, " if template.system
              else "the template's default system, ")
    return (f"the chat template over {system}user [image, {SAMPLE_QUESTION + template.suffix!r}] "
            "(--tokenizer renders it)")

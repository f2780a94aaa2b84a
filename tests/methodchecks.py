"""The methods' oracle, shared by tests/engine/test_methods.py and the family battery: each method's
logits by its paper's formula from a transformers model, and the check of the engine's methods
against them."""
import math

import torch
from tinymodels import QUESTIONS, edited_eager_attention, synthetic_image

from pope_fast.engine import Engine, Settings
from pope_fast.engine.methods import ICD, diffusion_noise, noise_generator, parse_method

IMAGES = [synthetic_image(i + 81, size) for i, size in enumerate([(90, 40), (60, 60)])]
METHODS = ["none", "vcd:noise_step=400,seed=3", "pai:layers=0-1,alpha=0.5", "icd:beta=0.05",
           "m3id:lambda=0.4"]
M3ID_WEIGHT = (1 - math.exp(-0.4)) / math.exp(-0.4)  # (1 - gamma_1) / gamma_1 at lambda 0.4


def pai_attention(alpha, layers, state):
    """Eager attention with PAI's edit in the language model's layers: at the last query only, image
    scores s → s + alpha |s|."""
    def edit(module, scores):
        if id(module) in state.get("language", ()) and layers[0] <= module.layer_idx <= layers[1] \
                and "image" in state:
            last = scores[:, :, -1, state["image"]]
            scores[:, :, -1, state["image"]] = last + alpha * last.abs()
        return scores

    return edited_eager_attention(edit)


def plausible(logits, beta):
    return logits >= math.log(beta) + logits.max()


def formula_oracle(checkpoint, model_class, make_inputs):
    """Per (image, question): each method's full-vocabulary logits by its paper's formula, from the
    transformers model run on the image, its noised copy (the same noise), the prompt without its
    image tokens (PAI's and M3ID's), the prompt under ICD's instruction, and with PAI's edit in its
    eager attention."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    state = {}
    AttentionInterface.register("pope_fast_pai", pai_attention(0.5, (0, 1), state))
    # the model's own mask for the edited attention: a registered function otherwise gets none and
    # falls back to causal, which drops a mask that is not (Gemma 3's bidirectional image block)
    AttentionMaskInterface.register("pope_fast_pai", eager_mask)
    plain = model_class.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    edited = model_class.from_pretrained(str(checkpoint), dtype=torch.float32,
                                         attn_implementation="pope_fast_pai").eval()
    # Idefics3's name
    language = getattr(edited.model, "language_model", None) or edited.model.text_model
    state["language"] = {id(m) for m in language.modules()}
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    inputs_of = make_inputs(checkpoint)
    out = {}
    for i, image in enumerate(IMAGES):
        key = engine.prepare([image])[0].key
        for q in QUESTIONS[:3]:
            inputs = inputs_of(image, engine.prompt(q))
            image_slots = inputs["input_ids"][0] == plain.config.image_token_id
            noised = torch.from_numpy(diffusion_noise(inputs["pixel_values"].numpy(), 400,
                                                      noise_generator(key, 3)))
            disturbed = inputs_of(image, engine.prompt(q, ICD.defaults["instruction"]))
            # the answer position's logits only, not every position's over the vocabulary
            last = {"logits_to_keep": 1}
            with torch.no_grad():
                main = plain(**inputs, **last).logits[0, -1]
                l_noised = plain(**dict(inputs, pixel_values=noised), **last).logits[0, -1]
                l_text = plain(input_ids=inputs["input_ids"][:, ~image_slots], **last).logits[0, -1]
                l_disturbed = plain(**disturbed, **last).logits[0, -1]
                state["image"] = image_slots
                l_pai = edited(**inputs, **last).logits[0, -1]
                del state["image"]
            vcd = (2 * main - l_noised).masked_fill(~plausible(main, 0.1), -math.inf)
            icd = (2 * main - l_disturbed).masked_fill(~plausible(main, 0.05), -math.inf)
            lp, lt = torch.log_softmax(l_pai, -1), torch.log_softmax(l_text, -1)
            pai = (1.1 * (lp - lt) + lt).masked_fill(~plausible(lp, 0.1), -math.inf)
            lc = torch.log_softmax(main, -1)
            m3id = (lc + M3ID_WEIGHT * (lc - lt)).masked_fill(~plausible(main, 0.1), -math.inf)
            out[i, q] = {"none": main, "vcd": vcd, "pai": pai, "icd": icd, "m3id": m3id}
    return out


def check_methods(engine, oracle):
    methods = [parse_method(m) for m in METHODS]
    out = engine.run_methods(engine.prepare(IMAGES), [QUESTIONS[:3], QUESTIONS[:3]], methods)
    for name, results in out.items():
        for i in range(len(IMAGES)):
            for q, ours in zip(QUESTIONS[:3], results[i]):
                theirs = oracle[i, q][name]
                assert ours.first_token_id == int(theirs.argmax()), (name, i, q)
                for token, value in ours.candidate_logits.items():
                    expected = float(theirs[token])
                    if math.isinf(expected):
                        assert value == expected, (name, token)
                    else:
                        assert abs(value - expected) <= 1e-4, (name, i, q, token, value, expected)
    # the methods moved the answers: a real comparison, not the baseline compared with itself
    for name in ("vcd", "pai", "icd", "m3id"):
        assert any(out[name][0][j].candidate_logits != out["none"][0][j].candidate_logits
                   for j in range(3)), name


def sid_oracle(checkpoint, model_class, inputs_of, prompts, layer, keep, alpha, beta):
    """Per (image, prompt): SID's logits as huofushuo/SID computes them, on transformers' class in
    eager attention. The image tokens kept: the `keep` least attended by the last query in
    layer - 1's attention weights averaged over heads (minigpt4/models/modeling_llama.py:653-661);
    the contrast pass: every other image token masked for every query from layer `layer` on
    (:663-670); then (1 + alpha) l - alpha l_cd where l >= log(beta) + max l
    (vcd_sample.py:177-184). Also each prompt's image-token count, and the contrast pass's
    logits."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    state = {}

    def drop(module, scores):
        if id(module) in state.get("language", ()) and module.layer_idx >= layer \
                and "dropped" in state:
            scores[:, :, :, state["dropped"]] = float("-inf")
        return scores

    AttentionInterface.register("pope_fast_sid", edited_eager_attention(drop))
    AttentionMaskInterface.register("pope_fast_sid", eager_mask)
    plain = model_class.from_pretrained(str(checkpoint), dtype=torch.float32,
                                        attn_implementation="eager").eval()
    masked = model_class.from_pretrained(str(checkpoint), dtype=torch.float32,
                                         attn_implementation="pope_fast_sid")
    state["language"] = {id(m) for m in masked.eval().model.language_model.modules()}
    out = {}
    for i, image in enumerate(IMAGES):
        for prompt in prompts:
            inputs = inputs_of(image, prompt)
            slots = torch.nonzero(inputs["input_ids"][0] == plain.config.image_token_id)[:, 0]
            with torch.no_grad():
                run = plain(**inputs, output_attentions=True)
                weights = run.attentions[layer - 1][0].mean(dim=0)[-1, slots]  # [image tokens]
                kept = slots[weights.topk(keep, largest=False).indices]
                state["dropped"] = slots[~torch.isin(slots, kept)]
                l_cd = masked(**inputs).logits[0, -1]
                del state["dropped"]
            main = run.logits[0, -1]
            sid = ((1 + alpha) * main - alpha * l_cd).masked_fill(~plausible(main, beta), -math.inf)
            out[i, prompt] = sid, len(slots), l_cd
    return out


def _std_outliers_zeroed(x):
    """ONLY's zeroing (zifuwan/ONLY modeling_llama.py:487, :494): entries above the row's mean + std
    (unbiased): 0."""
    return torch.where(x > x.mean(-1, keepdim=True) + x.std(-1, keepdim=True),
                       torch.zeros_like(x), x)


def only_oracle(model, inputs, layer):
    """ONLY's passes as zifuwan/ONLY computes them (its patched modeling_llama.py:483-522 in layer
    `layer`, :651-660 in the last layer, :993 the final norm), on transformers' class in eager
    attention, the image's span in place of LLaVA's hard-coded 35:35+576. → (l, l_cd, tvd, the
    image's rows of the input embeddings: MemVR's tokens)."""
    lm = model.model.language_model
    kept = {}
    hook = lm.layers[layer].self_attn.v_proj.register_forward_hook(
        lambda m, i, o: kept.__setitem__("v", o))
    with torch.no_grad():
        run = model(**inputs, output_attentions=True, output_hidden_states=True)
        hook.remove()
        main = run.logits[0, -1]
        w = run.attentions[layer][0].clone()  # [heads, S, S]
        slots = torch.nonzero(inputs["input_ids"][0] == model.config.image_token_id)[:, 0]
        start, end = int(slots[0]), int(slots[-1]) + 1
        text = _std_outliers_zeroed(torch.cat([w[:, :, 1:start], w[:, :, end:]], dim=-1))
        w[:, :, 1:start], w[:, :, end:] = text[:, :, :start - 1], text[:, :, start - 1:]
        text_norm = (text / text.sum(-1, keepdim=True))[:, -1]
        image = _std_outliers_zeroed(w[:, :, start:end])
        w[:, :, start:end] = image
        image_norm = (image / image.sum(-1, keepdim=True))[:, -1]
        entropy_text = (-(text_norm * torch.log(text_norm + 1e-6)).sum(-1)).nan_to_num(nan=0.0)
        entropy_image = (-(image_norm * torch.log(image_norm + 1e-6)).sum(-1)).nan_to_num(
            nan=float("inf"))
        ratio = entropy_text / entropy_image
        w[torch.where(ratio < ratio.mean())[0]] = 0
        heads, length = w.shape[0], w.shape[-1]
        # [kv heads, S, D]
        v = kept["v"][0].view(length, -1, lm.layers[layer].self_attn.head_dim).transpose(0, 1)
        v = v.repeat_interleave(heads // v.shape[0], dim=0)
        cd = lm.layers[layer].self_attn.o_proj((w @ v).transpose(0, 1).reshape(length, -1))[-1]
        last = lm.layers[-1]
        h = 0.2 * run.hidden_states[len(lm.layers) - 1][0, -1] + last.input_layernorm(cd)
        h = h + last.mlp(last.post_attention_layernorm(h))
        l_cd = model.lm_head(lm.norm(h))
    tvd = torch.sum(torch.abs(torch.softmax(main, -1) - torch.softmax(l_cd, -1)))
    return main, l_cd, float(tvd), \
        run.hidden_states[0][0, inputs["input_ids"][0] == model.config.image_token_id]


def only_combined(main, l_cd, tvd, alpha_pos, alpha_neg, beta, gamma):
    """only_utils/only_sample.py:183-232: the branch by the total variation, then the plausibility
    cut."""
    diffs = main + alpha_pos * l_cd if tvd < gamma else (1 + alpha_neg) * main - alpha_neg * l_cd
    return diffs.masked_fill(main < math.log(beta) + main.max(), -math.inf)


def memvr_oracle(model, inputs, v, ratio, threshold, starting, ending):
    """MemVR's logits as 1zhou-Wang/MemVR computes them (memvr.py:204-257: each layer's early exit,
    its top-10 entropy over log 10, the adaptation of the next layer's MLP; :83-90 the MLP with its
    adapter, the scales of :248-249 included), on transformers' class through hooks; v the image's
    rows of the language model's input embeddings (:458). → (logits, the layer whose MLP retraced or
    None)."""
    lm = model.model.language_model
    state = {"inject": None}

    def exit_hook(i):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            logits = model.lm_head(lm.norm(hidden))[:, -1].float()
            probabilities = torch.softmax(torch.topk(logits, 10).values, dim=-1)
            entropy = float(torch.sum(-probabilities[:10] * torch.log(probabilities[:10]))
                            / math.log(10))
            if entropy > threshold and state["inject"] is None and starting < i < ending:
                state["inject"] = i + 1
        return hook

    def mlp_hook(i):
        def hook(module, args, output):
            if state["inject"] != i:
                return None
            w1 = (module.up_proj.weight.abs().mean() / v.abs().mean()) * v
            w2 = (module.down_proj.weight.abs().mean() / v.abs().mean()) * v.T
            adapter = torch.matmul(torch.matmul(args[0], w1.T), w2.T)
            return output * (1 - ratio) \
                + (output.abs().mean() / adapter.abs().mean()) * adapter * ratio
        return hook

    hooks = [layer.register_forward_hook(exit_hook(i)) for i, layer in enumerate(lm.layers)]
    hooks += [layer.mlp.register_forward_hook(mlp_hook(i)) for i, layer in enumerate(lm.layers)]
    try:
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
    finally:
        for h in hooks:
            h.remove()
    return logits, state["inject"]


def vista_oracle(checkpoint, model_class, inputs_of, images, prompts, lam, alpha, lens):
    """Per (image, prompt): VISTA's logits as LzVv123456/VISTA computes them, on transformers'
    class. The residual streams: each decoder layer's output at the last token (its ForwardTracer's
    forward hooks, steering_vector.py :65-88, 103-107), with the image and for the prompt without
    its image tokens; the vector: their difference through obtain_vsv's rank-1 PCA of one row
    (:113-129; myutils.py:104-130, svd_flip included); the steered pass: each mlp's output through
    VSVLayer (llm_layers.py:15-34); the logits: alpha times the mean of lm_head over
    hidden_states[1:][first..last] plus (1 - alpha) times the model's (llava_llama.py:93-103)."""
    model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    layers = model.model.language_model.layers

    def streams(**inputs):
        seen = []
        hooks = [layer.register_forward_hook(lambda m, a, out: seen.append(
            (out[0] if isinstance(out, tuple) else out)[0, -1].float())) for layer in layers]
        model(**inputs)
        for hook in hooks:
            hook.remove()
        return torch.stack(seen)

    def steer(v):
        def hook(module, args, out):
            x, unit = out.double(), v.double() / v.double().norm()
            weight = 1 + torch.clamp(
                torch.nn.functional.cosine_similarity(x, -v.double()[None, None], dim=-1),
                min=0)[..., None]
            turned = x / x.norm(dim=-1, keepdim=True) + lam * weight * unit
            return (turned / turned.norm(dim=-1, keepdim=True)
                    * x.norm(dim=-1, keepdim=True)).to(out.dtype)
        return hook

    out = {}
    for i, image in enumerate(images):
        for prompt in prompts:
            inputs = inputs_of(image, prompt)
            slots = inputs["input_ids"][0] == model.config.image_token_id
            with torch.no_grad():
                pos, neg = streams(**inputs), streams(input_ids=inputs["input_ids"][:, ~slots])
                row = (pos - neg).reshape(1, -1)
                mean = row.mean(0, keepdim=True)
                u, _, vh = torch.linalg.svd(row - mean, full_matrices=False)
                vsv = (vh[:1] * torch.sign(u[u.abs().argmax(0), 0]) + mean).mean(0).view(pos.shape)
                hooks = [layer.mlp.register_forward_hook(steer(v)) for layer, v in zip(layers, vsv)]
                run = model(**inputs, output_hidden_states=True)
                for hook in hooks:
                    hook.remove()
                hidden = run.hidden_states[1:]
                aug = torch.stack([model.lm_head(hidden[k])
                                   for k in range(lens[0], lens[1] + 1)]).mean(0)
            out[i, prompt] = (alpha * aug + (1 - alpha) * run.logits)[0, -1]
    return out


def clearsight_oracle(checkpoint, model_class, inputs_of, images, prompts, layers, enh, sup):
    """Per (image, prompt): ClearSight's logits as its AttnAdapter computes them
    (ustc-hyin/ClearSight visaug/inference/AttnAdapter.py:68-78), on transformers' class in eager
    attention: in layers first..last, the raw scores of the queries after the image span times enh
    over its keys and times sup over every key before it (its SYS_LEN and IMG_LEN: LLaVA-1.5's 35
    and 576, here the prompt's own span)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    state = {}

    def amplify(module, scores):
        if id(module) in state.get("language", ()) and layers[0] <= module.layer_idx <= layers[1] \
                and "span" in state:
            start, end = state["span"]
            scores = scores.clone()
            scores[:, :, end:, start:end] = enh * scores[:, :, end:, start:end]
            scores[:, :, end:, :start] = sup * scores[:, :, end:, :start]
        return scores

    AttentionInterface.register("pope_fast_vaf", edited_eager_attention(amplify))
    AttentionMaskInterface.register("pope_fast_vaf", eager_mask)
    model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32,
                                        attn_implementation="pope_fast_vaf")
    state["language"] = {id(m) for m in model.eval().model.language_model.modules()}
    out = {}
    for i, image in enumerate(images):
        for prompt in prompts:
            inputs = inputs_of(image, prompt)
            slots = torch.nonzero(inputs["input_ids"][0] == model.config.image_token_id)[:, 0]
            state["span"] = int(slots[0]), int(slots[-1]) + 1
            with torch.no_grad():
                out[i, prompt] = model(**inputs).logits[0, -1]
            del state["span"]
    return out


def avisc_oracle(checkpoint, model_class, inputs_of, images, prompts, gamma, lamb, alpha, beta):
    """Per (image, prompt): AvisC's logits as sangminwoo/AvisC computes them, on transformers' class
    in eager attention, and how many of its image tokens were zeroed of how many. The layers: each
    one's share of the answer position's head-averaged attention on the image, the fewest largest
    holding gamma (avisc_sample.py:138-145, 160-170); the tokens zeroed: below mean + lamb std of
    their attention averaged over those layers (:175-179); zeroed in the language model's input
    embeddings (llava_llama.py:93-112); then (1 + alpha) l - alpha l_masked within the cut
    (:203-208)."""
    model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32,
                                        attn_implementation="eager").eval()
    state = {}

    def zero(module, args, kwargs):
        if "zero" in state:
            kwargs["inputs_embeds"] = kwargs["inputs_embeds"].clone()
            kwargs["inputs_embeds"][0, state["zero"]] = 0.0
        return args, kwargs

    model.model.language_model.register_forward_pre_hook(zero, with_kwargs=True)
    out = {}
    for i, image in enumerate(images):
        for prompt in prompts:
            inputs = inputs_of(image, prompt)
            slots = torch.nonzero(inputs["input_ids"][0] == model.config.image_token_id)[:, 0]
            with torch.no_grad():
                run = model(**inputs, output_attentions=True)
                portion = torch.stack([a.mean(dim=1)[:, -1, slots].sum() for a in run.attentions])
                portion = portion / portion.sum()
                norm = (portion / portion.sum()).unsqueeze(0)
                k = (torch.cumsum(torch.sort(norm, descending=True)[0], dim=1) < gamma).sum() + 1
                _, top = torch.topk(portion.float(), int(k), dim=0)
                image_att = torch.stack([run.attentions[j].mean(dim=1)[:, -1, slots] for j in top],
                                        dim=1).mean(dim=1)
                mask_idx = torch.where(image_att < image_att.mean() + image_att.std() * lamb)[1]
                state["zero"] = slots[mask_idx]
                masked = model(**inputs).logits[0, -1]
                del state["zero"]
            main = run.logits[0, -1]
            avisc = ((1 + alpha) * main - alpha * masked).masked_fill(~plausible(main, beta),
                                                                      -math.inf)
            out[i, prompt] = avisc, len(mask_idx), len(slots)
    return out

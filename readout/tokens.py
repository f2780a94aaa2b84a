"""Token sets of the logit readouts, derived from a tokenizer and a template, and their audit.

Derived ids depend on the tokenizer library's version (transformers 5.x encodes " Yes" as the one
LLaMA token ▁Yes, 4.x as [▁, Yes]), so every run records the ids together with the versions.
"""
from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

from .readouts import FIRST_TOKEN, LEGACY_2TOK, LEGACY_8TOK, LOGIT, READOUTS, TokenSets
from .templates import SAMPLE_QUESTION, Template

YES_FORMS = ("yes", "Yes", " yes", " Yes")
NO_FORMS = ("no", "No", " no", " No")


def load_tokenizer(path: str | Path):
    """A transformers tokenizer from a local folder (never the hub)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder {path} does not exist")
    from transformers import AutoTokenizer  # needs only the `tokenizers` package, not torch

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    # Installed packages do not change under a running process: their metadata is read once.
    versions = []
    for name in ("transformers", "tokenizers", "torch", "bitsandbytes", "triton"):
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(versions)


def library_versions() -> dict[str, str]:
    return dict(_installed_versions())


def tokenizer_info(tokenizer) -> dict:
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "")),
            "class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
            "library_versions": library_versions()}


def token_strings(tokenizer, ids) -> dict[str, str]:
    """{id: token string} (`▁Yes`, `ĠNo`) for the ids the tokenizer has; an id past its
    vocabulary (a fixed legacy id in a small one, a padded lm_head row) is left out."""
    known = [i for i in ids if 0 <= i < len(tokenizer)]
    return {str(i): s for i, s in zip(known, tokenizer.convert_ids_to_tokens(known))
            if isinstance(s, str)}


def _encode(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=special))


def single_token_forms(tokenizer, forms=YES_FORMS + NO_FORMS) -> dict[str, list[int]]:
    """Each surface form's encoding without special tokens (a form is usable when it is one id)."""
    return {form: _encode(tokenizer, form, special=False) for form in forms}


def dynamic_single_sets(tokenizer) -> TokenSets:
    encoded = single_token_forms(tokenizer)

    def side(forms):
        return tuple(dict.fromkeys(encoded[f][0] for f in forms if len(encoded[f]) == 1))

    return TokenSets(side(YES_FORMS), side(NO_FORMS))


def first_answer_tokens(tokenizer, prompt: str, forms) -> dict[str, int | None]:
    """The first token the model would emit for each answer form right after `prompt`.

    Encodes prompt + form against prompt and takes the first new token. When the form merges with
    the prompt's last token (the prompt's own encoding is not a prefix), no single next token spells
    the form, so it contributes nothing (None) rather than a merged token the model is never asked
    for.
    """
    base = _encode(tokenizer, prompt, special=True)
    found: dict[str, int | None] = {}
    for form in forms:
        full = _encode(tokenizer, prompt + form, special=True)
        extends = full[: len(base)] == base and len(full) > len(base)
        found[form] = full[len(base)] if extends else None
    return found


def template_aware_sets(tokenizer, template: Template,
                        question: str = SAMPLE_QUESTION) -> TokenSets:
    prompt = template.render(question, tokenizer)
    yes = first_answer_tokens(tokenizer, prompt, YES_FORMS)
    no = first_answer_tokens(tokenizer, prompt, NO_FORMS)
    return TokenSets(tuple(dict.fromkeys(i for i in yes.values() if i is not None)),
                     tuple(dict.fromkeys(i for i in no.values() if i is not None)))


def derive_token_sets(tokenizer, template: Template, names=None) -> dict[str, TokenSets]:
    """Token sets of every logit and first-token readout in `names` (default: all of them)."""
    names = [n for n in (names or READOUTS) if READOUTS[n].kind in (LOGIT, FIRST_TOKEN)]
    aware = template_aware_sets(tokenizer, template)
    builders = {
        "legacy_2tok": lambda: TokenSets(*LEGACY_2TOK),
        "legacy_8tok": lambda: TokenSets(*LEGACY_8TOK),
        "dynamic_single": lambda: dynamic_single_sets(tokenizer),
        "template_aware": lambda: aware,
        "first_token": lambda: aware,
    }
    return {name: builders[name]() for name in names}


def outside_vocabulary(sets: dict[str, TokenSets], vocab_size: int) -> dict[str, list[int]]:
    """Readouts whose ids are not rows of a vocab_size-row lm_head (a fixed legacy id in a small
    vocabulary), with those ids. vocab_size is the model's row count: often padded past the
    tokenizer's length (32064 vs 32002 for LLaVA-1.5)."""
    bad = {name: [i for i in s.ids if not 0 <= i < vocab_size] for name, s in sets.items()}
    return {name: ids for name, ids in bad.items() if ids}


def _answer_form(token: str | None) -> str | None:
    """'▁Yes' / 'ĠYes' / 'Yes' → 'yes'; None where the token is no bare yes/no (or none)."""
    if token is None:
        return None
    word = token.replace("\u2581", " ").replace("\u0120", " ").strip().lower()
    return word if word in ("yes", "no") else None


def audit_tokens(tokenizer, template: Template) -> dict:
    """Every token readout's ids with their strings, the one-token forms, and warnings."""
    sets = derive_token_sets(tokenizer, template)
    outside = outside_vocabulary(sets, len(tokenizer))
    aware = sets["template_aware"]
    forms = single_token_forms(tokenizer)
    prompt = template.render(SAMPLE_QUESTION, tokenizer)
    first = first_answer_tokens(tokenizer, prompt, YES_FORMS + NO_FORMS)

    def described(ids):
        return [{"id": i, "token": tokenizer.convert_ids_to_tokens(i)} for i in ids]

    readouts, warnings = {}, []
    for name, s in sets.items():
        readouts[name] = {"yes_ids": list(s.yes_ids), "no_ids": list(s.no_ids),
                          "yes_tokens": described(s.yes_ids), "no_tokens": described(s.no_ids)}
        if name.startswith("legacy_"):
            for side, ids in (("yes", s.yes_ids), ("no", s.no_ids)):
                for entry in described(ids):
                    fixed = f"{name}: fixed {side} id {entry['id']}"
                    if entry["token"] is None:
                        warnings.append(f"{fixed} is not in this vocabulary")
                    elif _answer_form(entry["token"]) != side:
                        warnings.append(f"{fixed} is {entry['token']!r} in this vocabulary, "
                                        f"not a {side} form")
        if name != "template_aware":
            for side, want, have in (("yes", aware.yes_ids, s.yes_ids),
                                     ("no", aware.no_ids, s.no_ids)):
                missed = [i for i in want if i not in have]
                if missed:
                    tokens = ", ".join(f"{i} {tokenizer.convert_ids_to_tokens(i)!r}"
                                       for i in missed)
                    warnings.append(f"{name}: misses the template-aware first {side} token(s) "
                                    f"{tokens}")
        if not s.yes_ids or not s.no_ids:
            warnings.append(f"{name}: an empty yes or no set, every answer is unknown")
        if name in outside:
            warnings.append(f"{name}: ids {outside[name]} lie outside this vocabulary of "
                            f"{len(tokenizer)} tokens")
    return {
        "template": template.name,
        "prompt": prompt,
        "tokenizer": tokenizer_info(tokenizer),
        "forms": {f: {"ids": ids, "single_token": len(ids) == 1,
                      "first_after_prompt": first[f]} for f, ids in forms.items()},
        "readouts": readouts,
        "warnings": warnings,
    }

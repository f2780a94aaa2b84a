"""The answer position's readout of a decoder (DecoderLM's): the final norm, then the lm_head for
the candidate rows only and a full-vocabulary argmax (`answer`), or where a method or a recorded
mass asks, the whole vocabulary's logits or log-sum-exp, a chunk of rows at a time, never
[sequence, vocabulary]. A family's logit softcap applies to every logit read here, as the model
reads them."""
from __future__ import annotations

import torch

from ...kernels import gather_logits, resolve_backend, vocab_argmax
from .ops import offset_rms_norm
from ..inputs.plan import to_device


class AnswerHead:
    """What DecoderLM reads at the answer position; it holds `dims`, `norm` (the final norm's
    weight), `lm_head`, `kernels`, `device` and `dtype`."""

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits rounded to the model dtype as transformers' lm_head gives them [.., n] → as the
        model reads them (fp32): through final_logit_softcapping's cap * tanh(logits / cap) in the
        model dtype, where set."""
        logits = logits.to(self.dtype)
        cap = self.dims.logit_softcap
        return (logits if cap is None else torch.tanh(logits / cap) * cap).float()

    def final_norm(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden, and the final norm's weight for the lm_head kernels to fuse (LLaMA's RMSNorm);
        the norm_unit_offset (1 + w) norm, which rounds once after scaling in fp32, is applied here
        instead (None to fuse)."""
        if self.dims.norm_unit_offset:
            return offset_rms_norm(hidden, self.norm, self.dims.rms_eps, kernels=self.kernels), None
        return hidden, self.norm

    @torch.inference_mode()
    def answer(self, last_hidden: torch.Tensor,
               ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """last_hidden [B, H] → candidate logits [B, n] (fp32) and the full-vocabulary argmax [B].

        Both are taken from logits rounded to the model dtype, as transformers' lm_head output is,
        so near-ties (ties, once rounded to fp16/bf16) resolve as in the reference pipeline.
        """
        backend = resolve_backend(self.kernels, self.device)
        index = to_device(torch.tensor(ids, dtype=torch.long), self.device)
        last_hidden, weight = self.final_norm(last_hidden)
        # the final norm, fused
        norm = dict(norm_weight=weight, eps=self.dims.rms_eps, backend=backend)
        logits = self._capped(gather_logits(last_hidden, self.lm_head.matrix, index, **norm))
        return logits, vocab_argmax(last_hidden, self.lm_head.matrix, **norm,
                                    logits_dtype=self.dtype)

    @torch.inference_mode()
    def vocab_logits(self, last_hidden: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """last_hidden [B, H] → the logits of the whole vocabulary [B, V] (fp32, rounded to the
        model dtype as `answer`'s are), for methods that combine passes over every token. One answer
        position per row: [B, V], never [B, S, V]; the lm_head rows go `chunk` at a time."""
        last_hidden, weight = self.final_norm(last_hidden)
        # raw_logits' are in the dtype already
        return self._capped(self.raw_logits(last_hidden, chunk, weight))

    @torch.inference_mode()
    def raw_logits(self, hidden: torch.Tensor, chunk: int = 8192,
                   norm_weight: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """The lm_head of hidden [B, H], after the final norm only where its weight is given: [B, V]
        fp32, rounded to the model dtype."""
        backend = resolve_backend(self.kernels, self.device)
        vocab = self.lm_head.matrix.shape[0]
        out = torch.empty(hidden.shape[0], vocab, dtype=torch.float32, device=self.device)
        for start in range(0, vocab, chunk):
            ids = torch.arange(start, min(start + chunk, vocab), device=self.device)
            out[:, start:start + len(ids)] = gather_logits(hidden, self.lm_head.matrix, ids,
                                                           norm_weight, self.dims.rms_eps, backend)
        return out.to(self.dtype).float()

    @torch.inference_mode()
    def vocab_logsumexp(self, last_hidden: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """last_hidden [B, H] → [B] fp32: the log-sum-exp of the answer position's logits over the
        whole vocabulary, each rounded to the model dtype (and softcapped) as `answer`'s candidates
        are (so e^(l - it) is a candidate's probability). The lm_head rows go `chunk` at a time
        through the candidates' own gather: never [B, V] at once."""
        backend = resolve_backend(self.kernels, self.device)
        last_hidden, weight = self.final_norm(last_hidden)
        norm = dict(norm_weight=weight, eps=self.dims.rms_eps, backend=backend)
        vocab = self.lm_head.matrix.shape[0]
        total = torch.full((last_hidden.shape[0],), float("-inf"), device=self.device)
        for start in range(0, vocab, chunk):
            ids = torch.arange(start, min(start + chunk, vocab), device=self.device)
            part = self._capped(gather_logits(last_hidden, self.lm_head.matrix, ids, **norm))
            total = torch.logaddexp(total, part.logsumexp(dim=-1))
        return total

    @torch.inference_mode()
    def lens_logits(self, residuals: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """residuals [B, L, H] (prefill_suffix's) → the mean over layers first..last of the lm_head
        applied to each one's output, [B, V] fp32, each rounded to the model dtype: without the
        final norm, except the last layer's, which transformers' hidden_states gives normed (its
        entry is the model's own logits)."""
        final = self.dims.num_layers - 1
        total = sum(self.vocab_logits(residuals[:, i]) if i == final
                    else self.raw_logits(residuals[:, i]) for i in range(first, last + 1))
        return total / (last - first + 1)

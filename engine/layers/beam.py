"""Beam search as transformers' generate runs it (GenerationMixin._beam_search and its helpers,
transformers 5.24 generation/utils.py l.3346-3900), for a tool that decodes with beams (LAVIS's
InstructBLIP: 5 beams, repetition penalty 1.5). Each row of the engine's batch is one of generate's
batch rows, searched on its own: its `num_beams` running beams, its finished beams and its stopping
heuristic, the same float32 operations in the same order, so a row's result does not depend on what
it is batched with.

Lengths count new tokens only (generate's `cur_len - decoder_prompt_len`), which is what its length
penalty, its heuristic and its max_length criterion read once the prompt is taken off."""
from __future__ import annotations

import torch

FAR = -1.0e9  # generate's "very large negative value"


class BeamSearch:
    """B rows x K beams. `step` takes the processed log-probabilities of every running beam
    [B * K, V] and returns the token each new running beam takes and the flat index of the beam it
    continues (the rows of the KV cache and of the rules' state to carry over), or None once every
    row's search is over."""

    def __init__(self, batch: int, num_beams: int, max_new: list[int], stop_ids: set[int],
                 length_penalty: float, early_stopping: bool | str, device):
        self.batch, self.beams = batch, num_beams
        self.length_penalty, self.early_stopping = length_penalty, early_stopping
        self.max_new = torch.tensor(max_new, device=device)[:, None]  # [B, 1]
        self.stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        # l.3680: the candidates kept per step, enough that num_beams of them still run after
        # any eos
        self.keep = max(2, 1 + len(stop_ids)) * num_beams
        self.top_beams = torch.arange(self.keep, device=device) < num_beams
        width = max(max_new)
        self.running = torch.zeros(batch, num_beams, width, dtype=torch.long, device=device)
        self.running_scores = torch.zeros(batch, num_beams, device=device)
        # every beam starts as the prompt: only the first one is taken
        self.running_scores[:, 1:] = FAR
        self.sequences = self.running.clone()
        self.scores = torch.full((batch, num_beams), FAR, device=device)
        self.finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
        # each finished beam's
        self.lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)
        self.improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
        self.new = 0

    def step(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        b, k = self.batch, self.beams
        vocab = log_probs.shape[-1]
        accumulated = (log_probs.view(b, k, vocab) + self.running_scores[:, :, None]).reshape(b, -1)
        # _get_top_k_continuations
        top_scores, top_index = torch.topk(accumulated, k=self.keep)
        source = top_index // vocab  # [B, keep]: which running beam each candidate continues
        tokens = top_index % vocab
        candidates = torch.gather(self.running, 1,
                                  source[:, :, None].expand(-1, -1, self.running.shape[2])).clone()
        candidates[:, :, self.new] = tokens
        # the stopping criteria of the candidates: an eos id, or max_length reached
        hits = torch.isin(tokens, self.stops) | (self.new + 1 >= self.max_new)
        # _get_running_beams_for_next_iteration
        running_scores = top_scores + hits.to(torch.float32) * FAR
        chosen = torch.topk(running_scores, k=k)[1]
        self.running = torch.gather(candidates, 1,
                                    chosen[:, :, None].expand(-1, -1, candidates.shape[2]))
        self.running_scores = torch.gather(running_scores, 1, chosen)
        sources = torch.gather(source, 1, chosen)
        # _update_finished_beams
        done = hits & self.top_beams[None, :]
        finished_scores = top_scores / ((self.new + 1) ** self.length_penalty)
        full = torch.all(self.finished, dim=-1, keepdim=True) & (self.early_stopping is True)
        finished_scores = finished_scores + full.to(torch.float32) * FAR
        finished_scores = finished_scores + (~self.improvable).to(torch.float32) * FAR
        finished_scores = finished_scores + (~done) * FAR
        merged = torch.cat((self.scores, finished_scores), dim=1)
        best = torch.topk(merged, k=k)[1]
        new_lengths = torch.full_like(top_scores, self.new + 1, dtype=torch.long)
        lengths = torch.cat((self.lengths, new_lengths), dim=1)
        merged_sequences = torch.cat((self.sequences, candidates), dim=1)
        self.sequences = torch.gather(merged_sequences, 1,
                                      best[:, :, None].expand(-1, -1, merged_sequences.shape[2]))
        self.scores = torch.gather(merged, 1, best)
        self.lengths = torch.gather(lengths, 1, best)
        self.finished = torch.gather(torch.cat((self.finished, done), dim=1), 1, best)
        self.new += 1
        # _check_early_stop_heuristic, then _beam_search_has_unfinished_sequences
        never = self.early_stopping == "never" and self.length_penalty > 0.0
        hypothetical = self.max_new if never else self.new
        best_possible = self.running_scores[:, :1] / (hypothetical ** self.length_penalty)
        worst = torch.where(self.finished, torch.min(self.scores, dim=1, keepdim=True)[0], FAR)
        self.improvable = self.improvable & torch.any(best_possible > worst, dim=-1, keepdim=True)
        more = bool(self.improvable.any()) \
            and not (bool(self.finished.all()) and self.early_stopping is True) \
            and not bool(hits.all())
        if not more:
            return None
        flat = sources + torch.arange(b, device=sources.device)[:, None] * k
        return self.running[:, :, self.new - 1].reshape(-1), flat.reshape(-1)

    def best(self) -> list[list[int]]:
        """Each row's best finished beam, its new tokens (the eos id that ended it included), as
        generate returns its first sequence: the finished beams sorted by score, the top one."""
        return [self.sequences[row, 0, :int(self.lengths[row, 0])].tolist()
                for row in range(self.batch)]

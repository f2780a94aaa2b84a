"""The language model's building blocks: the decoder every family's language model is, its
attention, the linear, norm and rotary ops, the MoE block, beam search and generation rules, and the
attention-edit API. Imports engine/inputs and engine/utils only."""

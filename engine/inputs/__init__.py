"""What a call feeds the model: image files and pixels, the feature cache, prompt ids and the prompt
plan (layouts, prefix groups, batches). Imports engine/utils only."""

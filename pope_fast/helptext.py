"""The command line's longer help texts (cli.py's options name them), kept here so the commands
read as their options."""

PROTOCOL_HELP = ("score under a published protocol: its answer rule and aggregation, and whether "
                 "the run is its")
FORMATS_HELP = ("the files of each figure, comma-separated: png (the page embeds it), pdf, svg, "
                "column (a 3.3 in PDF)")

SCORE_FORMAT = ("models: one F1 table per split, models (files) as rows and readouts as columns, "
                "best per row in bold, in markdown; latex: the same in LaTeX (booktabs); csv: a "
                "row per readout and split, Overall first (VLMEvalKit's score file, with source "
                "and readout columns), full precision")
SCORE_LAYERS = ("image-attention probe: the decoder layers averaged (inclusive; default: 14-19 on "
                "32-layer models, as the paper, else the middle fifth)")
SCORE_LABELS = ("corrected labels in POPE's format, one file per split named by it (RePOPE's "
                "annotations/coco_repope_{split}.json): the runs are scored under them too, side "
                "by side")
COMPARE_MISMATCH = ("compare runs that differ in more than their method (dtype, quantization, "
                    "template, token sets, questions, library versions, or an imported file "
                    "without meta.json); every table is flagged")

EVAL_MODEL = ("a checkpoint folder, or a hub id ORG/NAME[@REVISION] (the HF cache first, else "
              "downloaded); omit for the built-in demo (a random tiny LLaVA)")
EVAL_QUESTIONS = ("a POPE question file (JSON, JSON lines, lmms-lab parquet), a folder of them "
                  "(and POPE's below it: POPE/output), or a hub dataset id (lmms-lab/POPE); "
                  "repeatable; demo default: a built-in POPE set")
EVAL_IMAGES = ("the image folder (not needed for parquet, whose images are embedded); demo "
               "default: synthetic stand-ins named after the questions' images")
EVAL_SPLIT = ("split name for a single question file (default: its category column, else its "
              "name); of a hub dataset, the split to read (default: all)")
EVAL_DATASET = ("the question files' dataset (default: from their names: coco, aokvqa, gqa; "
                "lmms-lab for parquet)")
EVAL_IMAGE_BATCH = ("images per model step (their prefixes together); the unit torchrun ranks "
                    "share (both: sized to the device, docs/running.md)")
EVAL_MAX_NEW_TOKENS = ("new tokens for every string readout (default: each as its reference runs "
                       "it: string_parse 6, the others 128; the demo: 6)")
EVAL_IMAGE_ASPECT = ("processor (the default) | pad: original LLaVA's pad-to-square with the mean "
                     "colour first")
EVAL_PROTOCOL = ("a published protocol's prompt, generation length and image preprocessing for "
                 "this model (pope-fast protocols lists them); every readout is still recorded")
EVAL_NF4_WEIGHTS = "NF4: dequantize once at load (same values) or keep packed (less memory)"
EVAL_PROBE = ("record the answer position's attention mass on the image, per layer (:heads)")
EVAL_METHOD = ("a mitigation method (docs/methods.md; settings default to its paper's); "
               "repeatable: methods run paired on the same questions, each into OUT/NAME/, "
               "compared in OUT/compare.json")
EVAL_BACKEND = ("transformers: the model's own class, every prompt whole (auto: where the engine "
                "has no family)")
EVAL_BENCHMARK = ("default: what --questions is (MME's parquet, AMBER's data folder, "
                  "HallusionBench.json; else POPE)")

BENCH_MODELS = ("all (the families), or a comma-separated list of families and models without one "
                "(mllama, ...)")
BENCH_MODEL = ("NAME=DIR: a real checkpoint for a family (DIR: a folder or a hub id "
               "ORG/NAME[@REVISION])")
BENCH_SIZE = ("random weights at tiny (real image-token count) or real 7B dims (default: 7b on "
              "CUDA, tiny on CPU)")
BENCH_POPE = ("a folder of POPE question files, *pope*.json (images are synthetic stand-ins named "
              "after them)")
BENCH_PROBE = "pope-fast also records the image-attention probe (its cost is in the wall time)"
BENCH_REPEAT = ("timed runs of each pipeline (each pope-fast run cold: no records, no cached "
                "features); the median run counts")
BENCH_REFERENCE_SAMPLE = ("questions the reference runs, extrapolated to all (default: all on CPU, "
                          "200 on CUDA)")
BENCH_TOKENIZER = ("a real tokenizer for the random checkpoints, a folder or hub id (default: a "
                   "built-in stand-in)")
SCORE_PERCENT = "rates x100 (2 decimals in the tables); not with json or --protocol"
SCORE_BENCHMARK = ("default: what the files are (a run's records, another tool's result file's "
                   "layout)")
SCORE_DATA = ("the benchmark's question data, for a result file that holds no labels (AMBER's)")
COMPARE_BENCHMARK = ("default: the runs' meta.json; a benchmark's runs compare on its own metrics, "
                     "per rule")
AUDIT_TOKENIZER = ("a tokenizer (or checkpoint) folder, or a hub id ORG/NAME[@REVISION] (its "
                   "tokenizer files)")
EVAL_SUBSET = ("a hub dataset's subset (its card's config; default: 'default')")
EVAL_OUT = "output folder: records.jsonl, meta.json, summary.json, summary.md"
EVAL_DTYPE = "default: fp32 on CPU, fp16 on CUDA and with NF4"
EVAL_BATCH_SIZE = "question suffixes per prefill batch"
EVAL_CACHE_DIR = "disk cache of image features"
EVAL_SEED = ("the draws' seed, where --protocol samples (vcd)")
EVAL_QUANTIZE_LM_HEAD = "NF4: quantize lm_head too (transformers keeps it fp16)"
EVAL_NO_PREFIX_REUSE = "prefill every question whole (for ablations)"
EVAL_RECORD_MASS = ("record the answer position's log-sum-exp over every lm_head row")
EVAL_SKIP_BAD = "record missing or undecodable images as error records"
EVAL_LIMIT = "only the first N questions, in file order"
EVAL_PER_SPLIT = "only the first N of each split"
BENCH_QUESTIONS = "built-in POPE-shaped questions (6 per image); with --pope, a cap (0: all)"
BENCH_QUANT = "both pipelines (default: nf4 on CUDA as the paper ran it, none on CPU)"
BENCH_BATCH_SIZE = ("as eval's (default: the device's)")
BENCH_METHOD = "also time these methods as one paired sweep (as eval --method), beside the baseline"
BENCH_WORK_DIR = "keep checkpoints and records here"
PROTOCOLS_TOKENIZER = ("a checkpoint or tokenizer folder (or hub id) whose chat template renders "
                       "the chat prompts")

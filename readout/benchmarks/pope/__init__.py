"""POPE's room: its question files (questions.py), RePOPE's relabelling of them (relabel.py), and
its readers of other tools' per-question files (ugaa-research, lmms-eval, VLMEvalKit) as records."""

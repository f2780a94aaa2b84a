"""`python -m pope_fast` is the `pope-fast` command (what `torchrun -m pope_fast eval ...` runs)."""
from .cli import main

main(prog_name="pope-fast")

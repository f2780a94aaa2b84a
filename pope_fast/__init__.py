"""pope-fast: fast POPE evaluation of vision-language models under every answer readout.

Subpackages: `pope_fast.readout` (data, readouts, metrics, records; no torch), `pope_fast.engine`
(loading and the prefill step), `pope_fast.kernels` (Triton kernels with torch references),
`pope_fast.bench` (throughput benchmarks); `pope_fast.cli` is the `pope-fast` command.
"""
__version__ = "0.1.0"

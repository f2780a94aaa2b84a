"""Readers of other tools' file formats that several benchmarks' rooms read, one module a format."""

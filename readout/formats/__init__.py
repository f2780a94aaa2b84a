"""Readers of other tools' file formats that more than one benchmark's room reads, one module a format."""

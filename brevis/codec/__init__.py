"""Compression and decompression: plans, chunk jobs, the assembler that writes the index, and the decode path."""

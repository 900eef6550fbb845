"""Worker processes and threads: the pool, chunk and decode tasks, shared-memory batches, the heap setting."""

"""Worker processes and threads.

- processes.py: `open_workers` (every caller's way to worker processes:
  whether they pay, fork or spawn, their signals and death), `Workers`.
- executor.py: the processes themselves (`WorkerProcesses`), loaded with
  multiprocessing only where they start.
- pool.py: the thread pool, ordered maps over any executor, runs of jobs.
- tasks.py: the chunk and learning jobs a worker runs for the encoder.
- shared.py: chunk results that come back through /dev/shm.
- heap.py: keeping freed memory in the heap while chunks are coded.
"""

from .processes import Workers, can_start_processes, open_workers, process_context  # noqa: F401

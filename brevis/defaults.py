"""Defaults the command line shows before any heavy import: `brevis --help`
and a usage error need neither numpy nor the codec (brevis/cli.py imports
brevis.api on a command's first use)."""

import os

DEFAULT_EFFORT = 2  # compress's -e (synth/planner.py: EFFORTS)
# The largest K whose members all decode within 1.5 times a standalone
# archive of their checkpoint on the MiniLM fine-tuning run (weights and
# AdamW state; benchmarks/series.py, README "Training runs"): a member
# decodes about as slowly as the sum of the archives it reads.
DEFAULT_KEYFRAME_EVERY = 2


def default_threads() -> int:
    """One per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

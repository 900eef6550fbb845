"""The BrevisError family.

Every failure a user can cause or meet (bad arguments, damaged archives,
I/O trouble) is a BrevisError of one kind; the CLI maps each kind to a
one-line message and a distinct exit code. Anything else is a bug.
"""

from __future__ import annotations


class BrevisError(Exception):
    """Base of every error Brevis reports to a user."""

    exit_code = 1
    kind = "error"
    # The option of the command line that gets past this error ("force",
    # "base"), if any: the CLI adds its own words for it, so that messages
    # raised to Python callers speak of no command-line option.
    option: str | None = None

    def __init__(self, *args, option: str | None = None):
        super().__init__(*args)
        if option is not None:
            self.option = option


class InvalidArgument(BrevisError):
    """The caller asked for something impossible (bad path, bad option)."""

    exit_code = 2
    kind = "invalid argument"


class FormatError(BrevisError):
    """The archive is not a Brevis archive or its structure is damaged."""

    exit_code = 3
    kind = "corrupt archive"


class TruncatedError(FormatError):
    """The archive ends before the structures it declares."""

    exit_code = 4
    kind = "truncated archive"


class UnsupportedVersion(FormatError):
    """The archive was written by a newer format version."""

    exit_code = 5
    kind = "unsupported version"


class ChecksumError(BrevisError):
    """Decoded bytes differ from what the archive (or the source) says."""

    exit_code = 6
    kind = "checksum mismatch"


class OutputExists(InvalidArgument):
    """An output path exists and overwriting was not asked for (force=True)."""

    exit_code = 7
    kind = "output exists"


class BaseRequired(InvalidArgument):
    """The archive was coded against a base model and none was given."""

    option = "base"


class IOFailure(BrevisError):
    """The operating system refused a read or write (disk full, permissions)."""

    exit_code = 8
    kind = "i/o error"


class ProgramError(FormatError):
    """A program is malformed: unknown operator, bad config, type mismatch."""

    exit_code = 9
    kind = "invalid program"


class NotApplicable(Exception):
    """An operator's forward direction cannot represent this input.

    Raised while compressing only (e.g. a constant operator meeting two
    values); the encoder then falls back to a program that always applies.
    Not a BrevisError: it never reaches a user.
    """

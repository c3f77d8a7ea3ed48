"""User-facing errors.

Every error a user can cause by what they typed or wrote in a job file is a
:class:`TrainplanError`.  The CLI prints its message on one line and exits with
code 2; it never shows a traceback for these.
"""

from __future__ import annotations


class TrainplanError(Exception):
    """An error in user input, reported as one clear line.

    ``field`` names the job-file field or command-line option at fault (when
    there is one), so the message can start with it.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None, source: str | None = None):
        self.field = field
        self.source = source
        super().__init__(message)

    def __str__(self) -> str:  # one line, source and field first
        msg = super().__str__().replace("\n", " ")
        prefix = ""
        if self.source:
            prefix += f"{self.source}: "
        if self.field:
            prefix += f"{self.field}: "
        return prefix + msg


class SpecError(TrainplanError):
    """The job file is malformed or a field has a value that is not allowed."""


class CatalogError(TrainplanError):
    """A catalog data file has a bad row, or a name is not in the catalog."""


class InfeasibleError(TrainplanError):
    """No option satisfies the job's constraints."""

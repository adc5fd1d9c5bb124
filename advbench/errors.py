"""One exception type for every user-facing failure.

The CLI turns it into a single line on stderr and exit status 1, so library code raises it
with a message that says what was expected and what came instead.
"""


class AdvbenchError(Exception):
    """A problem the user can fix: bad config, missing file, corrupt checkpoint, NaN output."""

"""The root of every error a user can cause or fix.

An `MlgoError`'s message is one line that says what is wrong and where (a file, an option, a
package), so `mlgo` prints it alone and exits 2. Any other exception is a bug of mlgo's and
keeps its traceback. A subclass may also derive from the built-in error it is a case of
(a bad value is a ValueError too), so that code catching that built-in still catches it.
"""

from __future__ import annotations


class MlgoError(Exception):
    """Something the user can act on; the message is one line."""


class UsageError(MlgoError, ValueError):
    """A value the user gave (an option, a name, a file's contents) that mlgo cannot use."""


# The errors a user can cause or fix: mlgo's own (each one line), and the operating system's
# about the user's files and machine (a missing path, a full disk: each names its file).
# Anything else is a bug and keeps its traceback.
USER_ERRORS = (MlgoError, OSError)

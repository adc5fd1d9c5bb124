"""Config values that become parts of file names, checked before anything is written.

Option names (`dataset.name`, `attack.name`, ...) name record parts and cached checkpoints.
A name holding a separator, `..` or an absolute path would write outside the output folder
or the cache, so such names are refused up front with a one-line error naming the key.
Names that come from data (a video's file stem) cannot be refused for that: `file_name` maps
them to a name of the same rule instead.
"""

from __future__ import annotations

import hashlib
import re

from advbench.core.errors import AdvbenchError

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,127}")
"""Letters, digits and `_ . + = -`; not starting with a dot (hidden files are skipped as
in-progress state) or a dash; at most 128 characters."""


def safe_name(value: object, key: str) -> str:
    """`value` as a file-name component, or an AdvbenchError naming `key`."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not SAFE_NAME.fullmatch(text):
        raise AdvbenchError(
            f"{key}={value!r} cannot be part of a file name: use letters, digits and _ . + = - only "
            "(no '/' or '\\', not starting with '.' or '-', at most 128 characters)"
        )
    return text


def file_name(text: str) -> str:
    """`text` as a file-name component: itself when it is a safe name, else a safe stand-in.

    The stand-in keeps the safe characters (so the folder is still recognisable) and adds a
    digest of the whole text: two texts get different stand-ins (short of a 48-bit digest
    collision), and one text always gets the same one, so a rerun finds its earlier files. `..` becomes `dotdot-<digest>`, never a way up.
    """
    if SAFE_NAME.fullmatch(text):
        return text
    kept = re.sub(r"[^A-Za-z0-9_.+=-]", "_", text.replace("..", "dotdot")).lstrip(".-")
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{kept[:100] or 'file'}-{digest}"

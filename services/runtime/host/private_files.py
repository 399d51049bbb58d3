"""Files that hold secrets (passwords, the demo service token, the ClickHouse configs): owner-only.

A mode given at creation (`os.open(..., 0o600)`, `Path.touch(mode=...)`) leaves an existing file's
mode alone, so a file an older version (or an umask) made readable would stay so. Writing under a
new name and renaming over the old gives every write mode 0600, and never a half-written file.
"""

import os
import uuid
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

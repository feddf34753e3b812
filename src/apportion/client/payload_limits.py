"""How much one call may carry: refused in the client, before it is sent.

An oversized argument or scattered value is refused here with a way out, instead
of a frame the scheduler must refuse, which would end the whole session.
"""

from __future__ import annotations

from apportion.protocol.codec import MAX_FRAME

#: Largest pickled argument or scattered value: well inside one frame (MAX_FRAME).
MAX_PAYLOAD = MAX_FRAME // 4


def check_size(blob: bytes, what: str) -> None:
    """Raise ValueError, naming ``what``, if ``blob`` is too large for one message."""
    if len(blob) > MAX_PAYLOAD:
        raise ValueError(
            f"{what} pickle to {len(blob):,} bytes, more than the {MAX_PAYLOAD:,} one message "
            "may carry: split the data, or load it on the workers inside a task"
        )

"""Which module defines each wire message, by tag: a decoder loads a conversation's
module the first time one of its tags arrives (``base.message_class``).

So a process imports only the conversations it takes part in: a worker never loads
the people, coordination or job-queue messages it is never sent, and each module
imported costs its dataclasses being built. A new message adds its tag here;
``tests/protocol/test_wire_tags.py`` checks this table against the classes.
Modules are named, not imported: the job queue's (``runs/messages.py``) lies above
this layer.
"""

from __future__ import annotations

HOMES: dict[str, tuple[int, ...]] = {
    "apportion.protocol.handshake": (1, 2, 3, 4, 5, 6, 7, 8),
    "apportion.protocol.tasks": (
        *(9, 10, 11, 12, 13, 14, 18, 19, 20, 21, 22, 23, 27, 46, 48, 87, 119),
        *(124, 125, 136),
    ),
    "apportion.protocol.cluster": (
        *(15, 16, 17, 24, 25, 26, 53, 54, 60, 61, 73, 74, 75, 76, 85, 86, 91, 92),
        *(120, 121, 122, 123, 126, 127),
    ),
    "apportion.protocol.worker": (
        *(28, 29, 30, 31, 32, 35, 36, 37, 38, 39, 42, 43, 44, 45, 47, 49, 50, 51),
        *(52, 93, 104, 105, 106, 137, 138),
    ),
    "apportion.protocol.peer_data": (33, 34, 40, 41, 107, 108),
    "apportion.runs.messages": (55, 56, 57, 58, 59, 62, 63, 64, 135),
    "apportion.protocol.remote_calls": (65, 66, 67, 68, 69, 70, 71, 72),
    "apportion.protocol.shared_data": (77, 78, 79, 80, 81, 82, 83, 84, 88, 89, 90),
    "apportion.protocol.services": (94, 95, 96, 97, 98, 99, 100, 101, 102, 103),
    "apportion.protocol.coordination": (109, 110, 111, 112, 113, 114, 115, 116, 117, 118),
    "apportion.protocol.people": (128, 129, 130, 131, 132, 133, 134),
}

#: Tag -> the module defining its message.
HOME_OF: dict[int, str] = {tag: module for module, tags in HOMES.items() for tag in tags}

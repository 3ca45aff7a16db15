"""What each end of a weight sync remembers of the conversation, as named states and moves.

The sync is a conversation over KV records (``client.py``'s module doc). What an end remembers
of it decides its next move: the trainer forms a broadcast group or reuses the one it has; an
explorer joins the current group, asks for a fresh one (``sync.hello``) or waits for it. Kept
as loose fields (a sender or None, a timestamp or None) that memory allowed combinations
nobody meant; here each end's memory of its group is one state of an enum, every change is a
named move in a table, and a move the table does not hold is a bug: :class:`Machine` raises.

The tables are the protocol's documentation too: ``docs/protocol.md`` prints them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)


class TrainerGroup(enum.Enum):
    """The trainer's broadcast group with the leading explorer's engines."""

    NONE = "none"
    FORMING = "forming"
    FORMED = "formed"


class ExplorerGroup(enum.Enum):
    """A leading explorer's membership of the trainer's broadcast group."""

    OUTSIDE = "outside"
    ASKED = "asked"
    JOINED = "joined"


class HelperGroup(enum.Enum):
    """An explorer that does not lead: its own group with the trainer, formed at a pull."""

    NONE = "none"
    JOINED = "joined"


#: What each state means (``docs/protocol.md`` prints it).
MEANINGS: Mapping[enum.Enum, str] = {
    TrainerGroup.NONE: "no group: the next offer forms one (publishes a rendezvous)",
    TrainerGroup.FORMING: "a rendezvous is out; the engines have not all connected yet",
    TrainerGroup.FORMED: "every member is in (`sync.formed`): offers are sent over it",
    ExplorerGroup.OUTSIDE: "in no group: it joins the one the next offer names, unless that group was "
                           "formed before this process started (its member was a predecessor): then it says hello",
    ExplorerGroup.ASKED: "it said `sync.hello` and waits for a group formed for it",
    ExplorerGroup.JOINED: "its engines are in the group of one rendezvous (`ts`): offers arrive over it",
    HelperGroup.NONE: "no group: its next pull asks the trainer to form one",
    HelperGroup.JOINED: "its engines are in its own group (the rendezvous `ts` its pulls name)",
}

G = TypeVar("G", bound=enum.Enum)

#: (state, move) -> next state. A move from a state not listed is a bug.
TRAINER_MOVES: Mapping[tuple[TrainerGroup, str], TrainerGroup] = {
    (TrainerGroup.NONE, "form"): TrainerGroup.FORMING,
    (TrainerGroup.FORMING, "connected"): TrainerGroup.FORMED,
    # a failed connect or send, a join that never came: the group is unusable
    (TrainerGroup.FORMING, "broken"): TrainerGroup.NONE,
    (TrainerGroup.FORMED, "broken"): TrainerGroup.NONE,
    # the leading explorer (re)started: its predecessor, the group's member, is gone
    **{(s, "hello"): TrainerGroup.NONE for s in TrainerGroup},
    **{(s, "close"): TrainerGroup.NONE for s in TrainerGroup},
}

EXPLORER_MOVES: Mapping[tuple[ExplorerGroup, str], ExplorerGroup] = {
    (ExplorerGroup.OUTSIDE, "hello"): ExplorerGroup.ASKED,
    (ExplorerGroup.OUTSIDE, "joined"): ExplorerGroup.JOINED,
    (ExplorerGroup.ASKED, "joined"): ExplorerGroup.JOINED,
    # the trainer formed a new group (it restarted, or its old one broke): join that one
    (ExplorerGroup.JOINED, "joined"): ExplorerGroup.JOINED,
    # no rendezvous came within sync_timeout: a hello goes unanswered, so ask again next time;
    # a member keeps its group (a newer rendezvous is joined when it comes)
    (ExplorerGroup.OUTSIDE, "no_rendezvous"): ExplorerGroup.OUTSIDE,
    (ExplorerGroup.ASKED, "no_rendezvous"): ExplorerGroup.OUTSIDE,
    (ExplorerGroup.JOINED, "no_rendezvous"): ExplorerGroup.JOINED,
    # a receive failed (the trainer died mid-broadcast): the group is gone
    (ExplorerGroup.JOINED, "lost"): ExplorerGroup.OUTSIDE,
    # it leads now (its leader died): a group formed for it, as for a restarted leader
    **{(s, "lead"): ExplorerGroup.OUTSIDE for s in ExplorerGroup},
}

HELPER_MOVES: Mapping[tuple[HelperGroup, str], HelperGroup] = {
    (HelperGroup.NONE, "joined"): HelperGroup.JOINED,
    # the trainer answered over a new group (it dropped the old one, or restarted)
    (HelperGroup.JOINED, "joined"): HelperGroup.JOINED,
    (HelperGroup.NONE, "lost"): HelperGroup.NONE,
    (HelperGroup.JOINED, "lost"): HelperGroup.NONE,
}


class IllegalMove(Exception):
    """A move its machine's table does not hold from the current state: a bug in the sync.
    Not a ``RuntimeError``: the clients read those as a broken group and go on."""


class Machine(Generic[G]):
    """One end's state and its table of moves; :meth:`move` is the only way to change it."""

    def __init__(self, name: str, moves: Mapping[tuple[G, str], G], start: G) -> None:
        self.name, self.moves, self.state = name, moves, start

    def move(self, event: str) -> G:
        """Take move ``event``; returns the new state (logged when it changes)."""
        nxt = self.moves.get((self.state, event))
        if nxt is None:
            raise IllegalMove(f"{self.name}: no move {event!r} from state {self.state.value!r}")
        if nxt is not self.state:
            log.info("sync_state", machine=self.name, move=event, before=self.state.value, after=nxt.value)
        self.state = nxt
        return nxt

    def __repr__(self) -> str:
        return f"Machine({self.name!r}, {self.state.value!r})"


#: Each machine by name: its table and its start state (``docs/protocol.md`` prints them).
MACHINES: Mapping[str, tuple[Mapping[tuple[Any, str], Any], enum.Enum]] = {
    "trainer": (TRAINER_MOVES, TrainerGroup.NONE),
    "explorer": (EXPLORER_MOVES, ExplorerGroup.OUTSIDE),
    "helper": (HELPER_MOVES, HelperGroup.NONE),
}

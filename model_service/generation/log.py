"""A generation's replay log: its messages by index, each serialized exactly once. The
newest entry stays a message while nobody has taken it, so tokens ready together merge
into it; consumers send the bytes as they are, the first time and on every replay."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.generation.runtime import Ledger

# Python's cost of one stored entry beyond its serialized bytes (bytes header + list slot).
ENTRY_OVERHEAD_BYTES = 41

Entry = pb.GenerateResponse | bytes


class ReplayLog(list[Entry]):
    """Entries as bytes, but the newest while nothing has taken it: protobuf objects cost
    ~10x their wire size in memory. Read as a list (`len`, `[i]` at C speed: consumers ask
    for them per message); only the methods below add to it."""

    __slots__ = ("_ledger", "_tail_reasoning", "_tail_text", "bytes")

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self._tail_text: list[str] = []  # text merged into the newest entry, not yet in it
        self._tail_reasoning: list[str] = []  # the same for its thinking
        self._ledger = ledger  # told of every serialized entry's size, as `bytes` is
        self.bytes = 0  # of the serialized entries (what the replay cap counts)

    def take(self, i: int) -> bytes:
        """Entry `i` serialized; from now on nothing merges into it."""
        entry = self[i]
        if type(entry) is bytes:
            return entry
        return self._freeze(i)

    def add(self, msg: pb.GenerateResponse) -> None:
        """`msg` as the newest entry; the one before it is serialized (nothing merges into
        it any more)."""
        if self and type(self[-1]) is not bytes:
            self._freeze(len(self) - 1)
        self.append(msg)

    def close(self) -> None:
        """Serialize the newest entry: the log is complete (a final never grows)."""
        if self and type(self[-1]) is not bytes:
            self._freeze(len(self) - 1)

    def merge(self, text: str, token_ids: list[int]) -> bool:
        """Add a token delta to the newest entry if it is a chunk nobody has taken yet;
        False: the caller appends a new chunk."""
        if self:
            tail = self[-1]
            if type(tail) is not bytes and tail.HasField("chunk"):  # type: ignore[union-attr]
                # Joined once, when the entry is frozen: `chunk.text += part` copies the
                # whole text each time, quadratic for a client that stopped reading.
                self._tail_text.append(text)
                tail.chunk.token_ids.extend(token_ids)  # type: ignore[union-attr]
                return True
        return False

    def merge_choice(self, text: str, token_ids: list[int], choice: int) -> pb.TokenChunk | None:
        """`merge` for a chunk of `choice` without tool calls; returns the chunk merged into
        (None: the caller appends a new one)."""
        if self:
            tail = self[-1]
            if type(tail) is not bytes and tail.HasField("chunk"):  # type: ignore[union-attr]
                chunk: pb.TokenChunk = tail.chunk  # type: ignore[union-attr]
                if chunk.choice == choice and not chunk.tool_calls:
                    self._tail_text.append(text)
                    chunk.token_ids.extend(token_ids)
                    return chunk
        return None

    def merge_reasoning(
        self, reasoning: str, token_ids: list[int], choice: int
    ) -> pb.TokenChunk | None:
        """Thinking merged into the newest chunk of `choice` if nobody took it and it holds
        no answer text yet (a chunk's thinking comes before its text); returns the chunk
        (None: the caller appends a new one)."""
        if self and not self._tail_text:
            tail = self[-1]
            if type(tail) is not bytes and tail.HasField("chunk"):  # type: ignore[union-attr]
                chunk: pb.TokenChunk = tail.chunk  # type: ignore[union-attr]
                if chunk.choice == choice and not chunk.tool_calls and not chunk.text:
                    self._tail_reasoning.append(reasoning)
                    chunk.token_ids.extend(token_ids)
                    return chunk
        return None

    def _freeze(self, i: int) -> bytes:
        entry = self[i]
        if self._tail_text:  # only the newest entry is ever unfrozen, so this is it
            entry.chunk.text += "".join(self._tail_text)  # type: ignore[union-attr]
            self._tail_text = []
        if self._tail_reasoning:
            entry.chunk.reasoning += "".join(self._tail_reasoning)  # type: ignore[union-attr]
            self._tail_reasoning = []
        raw: bytes = entry.SerializeToString()  # type: ignore[union-attr]
        self[i] = raw
        size = len(raw) + ENTRY_OVERHEAD_BYTES
        self.bytes += size
        self._ledger.live_bytes += size
        return raw

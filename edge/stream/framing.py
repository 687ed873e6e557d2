"""`Framer`: a stream's SSE events with their ids, numbered as the client counts them.

Every event but the error carries an `id:` naming the generation and worker that hold it
and the upstream index to resume from (`edge.stream.ids`), taken from the message and the
call as they come: nothing is renumbered. A resumed stream skips what its client has.
"""

from __future__ import annotations

import orjson

from edge.stream import sse
from edge.stream.ids import PART_DONE, Origin
from edge.stream.job import Event, Job


class Framer:
    """One stream's event framing (see the module docstring)."""

    __slots__ = (  # noqa: RUF023 (grouped by meaning)
        "_text_head",
        "_text_tail",
        "_text_tmpl",
        "_job",
        "_origin",
        "_prefix",
        "_retry_pending",
        "_skip_seq",
        "framed_id",
        "replay",
        "seq",
    )

    def __init__(self, job: Job) -> None:
        self._job = job
        resume = job.resume
        self.replay = resume is not None and job.fmt.replay_from_start
        # Replayed from the start: every event is made again, those the client has
        # (seq <= the resume point's) are not sent. Else the count goes on from there.
        self.seq = resume.seq + 1 if resume is not None and not self.replay else 0
        self._skip_seq = resume.seq if resume is not None and self.replay else -1
        self._origin: tuple[str, str] = ("", "")  # (request id, worker key) of _prefix
        self._prefix = b""
        self.framed_id = b""  # of the last event framed
        self._retry_pending = True
        self._text_head: bytes | None = None  # of `delta(text)`, before JSON(text)
        self._text_tail = b""  # ... and after it
        self._text_tmpl = b""  # b"id: <prefix>%d.%d\ndata: <head>%s<tail>\n\n", per origin

    def frame(
        self, events: list[Event], index: int, *, final: bool = False, opening: bool = False
    ) -> bytes:
        """The events one upstream message made, framed: all but the last point at this
        message with their part number (the last at the next message; a final's last is
        `PART_DONE`; the opening's all at message 0). Those a resumed client has already
        are skipped."""
        resume = self._job.resume
        skip_part = resume.part if resume is not None and resume.cursor == index else 0
        out = []
        last = len(events) - 1
        for j, (name, data) in enumerate(events):
            if opening:
                cursor, part = 0, 0
            elif final:
                cursor, part = index, PART_DONE if j == last else j + 1
            elif j == last:
                cursor, part = index + 1, 0
            else:
                cursor, part = index, j + 1
            if self.replay:
                if self.seq <= self._skip_seq:
                    self.seq += 1  # the client has it: counted, not sent
                    continue
            elif part and part <= skip_part:
                continue
            out.append(self.event(data, cursor, name, part))
        return b"".join(out)

    def text_event(self, text: str, cursor: int, stamp: int = 0) -> bytes:
        """`event(fmt.delta(text, None), cursor)` from a template: one `orjson.dumps` and
        one `%` (orjson never writes a raw CR or LF, so nothing is scanned). With
        `Job.stamps` the chunk carries the worker's `stamp` too."""
        call, (rid, key) = self._job.call, self._origin
        # The same objects as when the template was made (an equal new one is only slower).
        if (
            not self._text_tmpl
            or self._retry_pending
            or (call.request_id is not rid or call.worker.key is not key)
        ):
            if self._text_head is None:  # the format's own delta, taken apart once
                mark = self._job.fmt.delta(_MARK, None)
                self._text_head, _, self._text_tail = mark.rpartition(orjson.dumps(_MARK))
            data = self._job.fmt.delta(text, None)
            if self._job.stamps:
                data = data[:-1] + STAMP_FIELD % stamp
            return self.event(data, cursor)
        self.framed_id = b"%s%d.%d" % (self._prefix, self.seq, cursor)
        self.seq += 1
        if self._job.stamps:
            return self._text_tmpl % (self.seq - 1, cursor, orjson.dumps(text), stamp)
        return self._text_tmpl % (self.seq - 1, cursor, orjson.dumps(text))

    def event(self, data: bytes, cursor: int, event: bytes | None = None, part: int = 0) -> bytes:
        job = self._job
        call = job.call
        origin = (call.request_id, call.worker.key)
        if origin != self._origin:  # a new stream, or a continuation on another worker
            self._origin = origin
            self._prefix = job.codec.prefix(Origin(*origin, job.owner, job.body))
            self._text_tmpl = b""  # made by the next text_event, if any
        if not self._text_tmpl and self._text_head is not None:
            tail = _literal(self._text_tail)
            if job.stamps:  # the chunk's JSON object gets one more field
                tail = tail[:-1] + STAMP_FIELD
            self._text_tmpl = (
                b"id: " + _literal(self._prefix) + b"%d.%d\ndata: " + _literal(self._text_head)
                + b"%s" + tail + b"\n\n"
            )  # fmt: skip
        eid = self._prefix + b"%d.%d" % (self.seq, cursor)
        if part:
            eid += b"~%d" % part
        self.seq += 1
        self.framed_id = eid
        framed = sse.encode_data(data, id=eid, event=event)
        if self._retry_pending:
            self._retry_pending = False
            return b"retry: %d\n" % job.config.retry_ms + framed
        return framed


# With `Job.stamps` (benchmarks): the worker's clock as the chunk's last field.
STAMP_FIELD = b',"sluice_worker_time_ns":%d}'
_MARK = "\x00"  # a text whose JSON appears nowhere else in a delta


def _literal(data: bytes) -> bytes:
    """`data` as literal text of a %-template."""
    return data.replace(b"%", b"%%")

"""The benchmark's multi-turn workload: conversations grow turn by turn, wait their turn,
end after `turns`, and share their system prompts."""

from __future__ import annotations

from scripts.bench.conversations import Conversations
from scripts.bench.record import RequestRecord
from scripts.bench.workload import WorkloadConfig, make_workload


def answer(text: str, ok: bool = True) -> RequestRecord:
    rec = RequestRecord(text=text)
    return rec if ok else rec.fail("http_503")


def test_each_turn_extends_the_last_with_the_answer_received() -> None:
    cfg = WorkloadConfig(kind="multiturn", users=1, turns=3, prompt_tokens=5, system_tokens=7)
    convs = make_workload(cfg)
    assert isinstance(convs, Conversations)
    t1 = convs.next()
    assert [r for r, _ in t1.messages] == ["system", "user"] and t1.turn == 1
    assert len(t1.messages[1][1].split()) == 5
    convs.done(t1, answer("the answer"))
    t2 = convs.next()
    assert t2.messages[:2] == t1.messages and t2.messages[2] == ("assistant", "the answer")
    assert t2.conversation == t1.conversation and t2.turn == 2
    convs.done(t2, answer("", ok=False))  # failed: the same turn is asked again
    again = convs.next()
    assert again.turn == 2 and again.messages[:3] == t2.messages[:3]
    convs.done(again, answer("second"))
    t3 = convs.next()
    convs.done(t3, answer("third"))
    fresh = convs.next()  # after 3 turns: a new conversation
    assert fresh.conversation != t1.conversation and fresh.turn == 1
    assert convs.totals.ended == 1 and convs.totals.failed_turns == 1


def test_conversations_wait_their_turn_and_share_system_prompts() -> None:
    cfg = WorkloadConfig(kind="multiturn", users=4, turns=8, system_prompts=2, seed=1)
    convs = Conversations(cfg)
    first = [convs.next() for _ in range(4)]
    assert len({s.conversation for s in first}) == 4
    extra = convs.next()  # all four are waiting for answers: a fifth opens
    assert extra.conversation not in {s.conversation for s in first}
    for s in first:
        convs.done(s, answer("ok"))
    assert [convs.next().conversation for _ in range(4)] == [s.conversation for s in first]
    systems = {s.messages[0][1] for s in [*first, extra]}
    assert len(systems) <= 2
    same = Conversations(cfg)
    assert [same.next().messages for _ in range(4)] == [s.messages for s in first]  # seeded

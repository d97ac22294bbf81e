"""Multi-turn replay (autotune.run.replay.converse) with a stand-in for one engine request: no vLLM."""

import asyncio

from autotune.run.replay import converse


def test_each_turn_is_sent_after_the_models_own_answer():
    sent = []

    async def send(sub, messages):
        sent.append((sub["id"], messages))
        return {"id": sub["id"], "text": f"answer {len(sent)}", "error": None, "finish_reason": "stop", "chunks": [[0, 1]]}

    recs = asyncio.run(converse({"id": "q", "turns": ["one", "two", "three"], "sampling": {}}, send))
    assert [r["id"] for r in recs] == ["q", "q#turn2", "q#turn3"]
    assert sent[2][1] == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "answer 1"},
                          {"role": "user", "content": "two"}, {"role": "assistant", "content": "answer 2"},
                          {"role": "user", "content": "three"}]


def test_turns_after_a_failed_one_are_not_sent_and_say_why():
    async def send(sub, messages):
        return {"id": sub["id"], "text": "", "error": "ValueError: prompt too long", "finish_reason": None, "chunks": []}

    recs = asyncio.run(converse({"id": "q", "turns": ["one", "two"], "sampling": {}}, send))
    assert recs[1]["id"] == "q#turn2" and recs[1]["chunks"] == []
    assert recs[1]["error"] == "not sent: turn 1 did not finish (ValueError: prompt too long)"

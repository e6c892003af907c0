"""Submissions graded on GPUs go to the queue of their exercise's world size (issue 20).

One worker per GPU consumes ``gpu``, one per pair ``gpu-x2``, one per group of four ``gpu-x4``
(deploy/). The API picks the queue when it stores the submission; the worker grades with the
exercise's world size. The enqueue is recorded, not sent.
"""

from __future__ import annotations

import pytest
from flask import Flask

from tests.service.conftest import World
from tests.service.test_exercises_api import GOOD, Recorder, _url

RING = "import torch\n\ndef ring_attention_local(q, k, v, *, causal, group, layout='zigzag', scale=None):\n    return q, q\n"


@pytest.fixture
def sent(app: Flask, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    from workers.tasks import grade_submission

    rec = Recorder(app)
    monkeypatch.setattr(grade_submission, "apply_async", rec)
    return rec


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("device", "queues"),
    [("cuda", ["gpu", "gpu-x2", "gpu-x4"]), ("cpu", ["cpu", "cpu", "cpu"])],
)
def test_each_exercise_goes_to_the_queue_of_its_world_size(
    world: World,
    sent: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    queues: list[str],
) -> None:
    monkeypatch.setitem(world.app.config, "GRADE_DEVICE", device)
    got = []
    for exercise, source in (
        ("attention-merge", GOOD),
        ("ring-attention", RING),
        ("ring-attention-x4", RING),
    ):
        r = world.post(_url(exercise), "alice", json={"source": source})
        assert r.status_code == 202, r.get_json()
        got.append(r.get_json()["queue"])
        stored = world.get(r.get_json()["url"], "alice").get_json()
        assert stored["exercise_id"] == exercise and stored["status"] == "queued"
    assert got == queues
    assert [c["queue"] for c in sent.calls] == queues
    catalogue = {e["id"]: e for e in world.get("/api/v1/exercises", "alice").get_json()}
    assert catalogue["ring-attention-x4"]["world_size"] == 4

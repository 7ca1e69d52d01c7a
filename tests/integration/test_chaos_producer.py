"""The chaos run's idempotent HTTP producer (chaos/actors.py ``producer``) against a real broker,
after answers that wrote some groups and not others (409). It once ignored a 409's results: it
neither acknowledged the groups written nor advanced their sequences, and kept its producer id,
so its next request sent NEW records under a sequence the partition already held; with the same
count that is a resend (docs/protocol.md section 9.4), answered 200 with the earlier batch's
offsets, and the actor acknowledged its new records at offsets holding others: the 240 s chaos
run's "19 acknowledged record(s) lost or wrong" (issue 38). Here partition 1 is fenced, so every
request naming both partitions is answered 409 with partition 0 written."""

from __future__ import annotations

import argparse


import chaos.actors as actors
from chaos.run import read_acks
from llog.fence import fence
from llog.reader import LogReader
from llog.writer import LogWriter

T = "partial409"


def test_the_idempotent_producer_acknowledges_only_its_own_records_after_partial_answers(module_config, broker, tmp_path, monkeypatch):
    with LogWriter(module_config, auto_initialize=True) as w:
        for p in (0, 1):
            w.append(T, p, [b"init"])
        fence(w.coordination, w.keys(T, 1), module_config)

    calls = {"produce": 0, "statuses": [], "duplicates": []}
    real_post = actors._post

    def post(url, body, timeout=5.0, route=None):
        answer = real_post(url, body, timeout=30.0, route=route)
        if url.endswith("/produce"):
            calls["produce"] += 1
            calls["statuses"].append(answer.status_code)
            if answer.status_code == 200:
                dups = [r for r in answer.json()["results"] if r.get("duplicate")]
                if dups:
                    calls["duplicates"].append((body, dups))
                    actors._stopping = True  # seen: stop after this answer is acknowledged
            if calls["produce"] >= 400:
                actors._stopping = True
        return answer

    monkeypatch.setattr(actors, "_post", post)
    args = argparse.Namespace(seed=1, dir=tmp_path, name="pi.t", partitions=2, topic=T, idempotent=True,
                              broker=broker)
    try:
        actors.producer(args, module_config)
    finally:
        actors._stopping = False

    acked = read_acks(tmp_path / "acks")
    with LogReader(module_config) as reader:
        log = {r.offset: r.value for r in reader.read_range(T, 0, 1)}
    wrong = sorted(o for (topic, _, p), acks in acked.items() if p == 0
                   for o, ones in acks.items() for a in ones if log.get(o) != a.value)
    print("statuses:", {s: calls["statuses"].count(s) for s in set(calls["statuses"])}, "requests:", calls["produce"])
    for body, dups in calls["duplicates"]:
        print("answered as a duplicate:", [(g["partition"], g["sequence"], g["records"][:2], len(g["records"]))
                                           for g in body["topic_partitions"]], dups)
    if wrong:
        print("acknowledged", acked[next(k for k in acked if k[2] == 0)][wrong[0]][0].value, "at", wrong[0],
              "which holds", log.get(wrong[0]))
    assert not wrong, f"{len(wrong)} acknowledged record(s) of {T}[0] lost or wrong, first at {wrong[:5]}"

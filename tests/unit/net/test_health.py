"""Each job's health for a load balancer (net/health.py): the answer to every state, the
path's checks, and the route served in process by net/http.py."""

from __future__ import annotations

import json

import pytest

from tests.support.ranks import http_get
from watchdog.net import health
from watchdog.net import http as httpd
from watchdog.status import NodeStatus, RankStatus


def rank(n: int, state: str, pid: int | None = None, **fields: object) -> RankStatus:
    return RankStatus(**{"job": "serve", "uid": 501, "rank": n, "pid": pid or 100 + n,
                         "state": state, "reason": f"r{n} {state}", **fields})


def ask(ranks: list[RankStatus], path: str = "/jobs/serve/health",
        ending: tuple[int, ...] = ()) -> tuple[int, dict]:
    asked = health.parse(path)
    assert isinstance(asked, health.Asked), asked
    code, body = health.Index.build(ranks, ending).answer(asked)
    return code, json.loads(body)


@pytest.mark.parametrize("states, ending, code, word", [
    (("running", "running"), (), 200, "running"),
    (("idle", "running"), (), 200, "running"),  # mlx_lm.server's rank 0 reading requests
    (("idle", "idle"), (), 200, "idle"),
    (("running", "suspect"), (), 503, "suspect"),
    (("running", "stalled"), (), 503, "hung"),
    (("blocked", "running"), (), 503, "hung"),
    (("running", "stopped"), (), 503, "stopped"),
    (("running", "running"), (101,), 503, "ending"),  # fenced: being ended, still running
    (("killed", "killed"), (), 503, "ended"),
    (("exited", "running"), (), 503, "ended"),  # a rank gone: the job cannot progress
])
def test_the_jobs_answer_follows_its_worst_rank(states, ending, code, word):
    got, body = ask([rank(n, s) for n, s in enumerate(states)], ending=ending)
    assert (got, body["state"], body["healthy"]) == (code, word, code == 200), body
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    if code == 503:
        assert body["reason"].startswith("rank "), body  # names the rank, says why


def test_a_relaunch_is_healthy_again_and_a_rank_is_answered_alone():
    # The job ended (killed) and relaunched under its name: the new ranks speak for it.
    ranks = [rank(0, "killed", 90), rank(1, "killed", 91), rank(0, "running"),
             rank(1, "running")]
    assert ask(ranks)[0] == 200
    code, body = ask([rank(0, "running"), rank(1, "stalled")], "/jobs/serve/ranks/0/health")
    assert code == 200 and body["rank"] == 0 and len(body["ranks"]) == 1
    assert ask([rank(0, "running"), rank(1, "stalled")], "/jobs/serve/ranks/1/health")[0] == 503
    code, body = ask([rank(0, "running")], "/jobs/serve/ranks/3/health")
    assert code == 404 and body["healthy"] is False


def test_an_owner_pins_its_job_against_another_users_records():
    # Another local user publishes a record naming the job, hung: with ?uid= only the
    # owner's ranks count.
    ranks = [rank(0, "running"), rank(1, "running"), rank(1, "stalled", 400, uid=1001)]
    assert ask(ranks)[0] == 503
    assert ask(ranks, "/jobs/serve/health?uid=501")[0] == 200
    assert ask(ranks, "/jobs/serve/health?uid=1001")[0] == 503
    assert ask(ranks, "/jobs/other/health")[0] == 404


@pytest.mark.parametrize("path", [
    "/jobs/%00x/health", "/jobs/" + "a" * 300 + "/health", "/jobs/j/health?uid=x",
    "/jobs/j/health?uid=1&x=2", "/jobs/%ff/health", "/jobs/a%1b%5b31m/health"])
def test_a_malformed_question_is_a_sentence(path):
    assert isinstance(health.parse(path), str)


def test_paths_that_are_no_health_question():
    for path in ("/jobs", "/jobs/j", "/jobs/j/ranks/x/health", "/jobs/a/b/health",
                 "/jobs/j/health/more"):
        assert health.parse(path) is None, path
    assert health.parse("/jobs/a%20b%2Fc/health") == health.Asked("a b/c")


@pytest.mark.slow
def test_served_with_the_reason_in_a_small_json_body():
    index = health.Index.build([rank(0, "stalled")], ())
    server = httpd.serve(("127.0.0.1", 0), lambda: NodeStatus(host="h"), lambda: True,
                         health=lambda: index)
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}"
    try:
        code, ctype, body = http_get(url + "/jobs/serve/health")
        assert code == 503 and ctype == "application/json"
        said = json.loads(body)
        assert said["state"] == "hung"
        assert said["reason"] == "rank 0 (pid 100) is stalled: r0 stalled"
        assert http_get(url + "/jobs/%00/health")[0] == 400
        assert http_get(url + "/jobs/nope/health")[0] == 404
        assert http_get(url + "/jobs/serve")[0] == 404
    finally:
        httpd.shut(server)

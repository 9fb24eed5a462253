"""The state sets are the one spelling every part judges by, records' JSON included."""

from watchdog.states import (
    ENDED,
    FINAL,
    GONE_STATUSES,
    HUNG,
    PAST_DEADLINE,
    STOPPED_STATUSES,
    WAITING_LONG,
    WAITING_PHASES,
    End,
    ProcStatus,
    State,
)


def test_sets_match_the_text_of_json_states():
    assert "stalled" in HUNG and "unkillable" in HUNG and "stopped" not in HUNG
    assert {"stalled", "blocked"} == {str(s) for s in PAST_DEADLINE} and "blocked" in PAST_DEADLINE
    assert "suspect" in WAITING_LONG and "running" not in WAITING_LONG
    assert "killed" in ENDED and "exited" in ENDED and "unkillable" not in ENDED
    assert FINAL == ENDED | {State.UNKILLABLE} and "unkillable" in FINAL
    assert WAITING_PHASES == {"wait", "init"}


def test_every_word_reads_as_its_value_wherever_it_goes():
    import json
    import logging

    from watchdog.cause import CAUSES, Cause
    from watchdog.daemon.signaller import Result

    for word in (*State, *ProcStatus, *Cause, *Result, *End):
        text = word.value
        assert str(word) == f"{word}" == format(word, "") == text
        assert f"{word:>20}" == f"{text:>20}" and f"{word!s}" == text
        assert json.dumps({word: word}) == json.dumps({text: text})
        assert word == text and hash(word) == hash(text) and word in {text}
        record = logging.LogRecord("x", logging.INFO, "", 0, "%s=%s", (word, word), None)
        assert record.getMessage() == f"{text}={text}"
    assert [c.value for c in CAUSES] == ["peer_stopped", "peer_dead", "node_unreachable",
                                         "data_link_down", "collective_wedged", "mismatch",
                                         "local_blocked", "unknown", "quiet_hang",
                                         "peer_never_joined"]


def test_process_statuses_are_psutils_words():
    import psutil

    for status in ProcStatus:
        assert getattr(psutil, f"STATUS_{status.name}") == status
    assert STOPPED_STATUSES == {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}
    assert GONE_STATUSES == {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}


def test_the_judge_reads_process_statuses_without_psutil():
    """The detector and the straggler judge take the stopped statuses from the
    vocabulary, not from the probes (which import psutil)."""
    import ast
    import pathlib

    import watchdog.daemon.judge as judge

    for path in pathlib.Path(judge.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "watchdog.daemon.probes":
                assert "STOPPED_STATUSES" not in {a.name for a in node.names}, path
            if isinstance(node, ast.Import):
                assert "psutil" not in {a.name for a in node.names}, path


def test_a_ladders_end_is_spelled_as_the_state_or_the_signal_result_it_was():
    # An incident's `outcome` has been journaled in these words since before `End`:
    # the ends a rank's lifecycle shares are State's, the others the signaller's.
    from watchdog.daemon.signaller import Result, end_of

    assert {End.KILLED, End.UNKILLABLE, End.EXITED} == {
        State.KILLED.value, State.UNKILLABLE.value, State.EXITED.value}
    stopped = (Result.GONE, Result.NOT_OURS, Result.DENIED, Result.UNKNOWN)
    assert [end_of(r).value for r in stopped] == [r.value for r in stopped]
    assert {str(e) for e in End} == {"killed", "unkillable", "exited", "gone", "not-ours",
                                     "denied", "unknown"}

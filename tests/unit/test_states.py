"""The state sets are the one spelling every part judges by, records' JSON included."""

from watchdog.states import ENDED, FINAL, HUNG, PAST_DEADLINE, WAITING_LONG, WAITING_PHASES, State


def test_sets_match_the_text_of_json_states():
    assert "stalled" in HUNG and "unkillable" in HUNG and "stopped" not in HUNG
    assert {"stalled", "blocked"} == {str(s) for s in PAST_DEADLINE} and "blocked" in PAST_DEADLINE
    assert "suspect" in WAITING_LONG and "running" not in WAITING_LONG
    assert "killed" in ENDED and "exited" in ENDED and "unkillable" not in ENDED
    assert FINAL == ENDED | {State.UNKILLABLE} and "unkillable" in FINAL
    assert WAITING_PHASES == {"wait", "init"}

"""The backoff of ``pkobatch dev``'s supervisor before it starts an exited controller again."""

from pkobatch.dev.supervisor import controller_backoff


def test_exits_after_short_runs_double_the_wait_up_to_a_minute() -> None:
    exits, waits = 0, []
    for _ in range(8):
        exits, wait = controller_backoff(5.0, exits)
        waits.append(wait)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_an_exit_after_a_minute_of_running_waits_a_second_again() -> None:
    exits, wait = controller_backoff(3.0, 6)
    assert (exits, wait) == (7, 60.0)
    assert controller_backoff(61.0, exits) == (1, 1.0)

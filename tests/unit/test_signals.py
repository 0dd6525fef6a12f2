import threading

from shared.signals import off_the_handler


def test_the_action_runs_on_another_thread_and_the_caller_does_not_wait_for_it() -> None:
    lock = threading.Lock()
    done = threading.Event()
    ran_on: list[threading.Thread] = []

    def action() -> None:
        with lock:  # the lock the caller holds, as a main thread inside Event.set() would
            ran_on.append(threading.current_thread())
            done.set()

    with lock:
        off_the_handler(action)  # returns at once although the action must wait for `lock`
        assert not done.is_set()
    assert done.wait(5)
    assert ran_on and ran_on[0] is not threading.main_thread()

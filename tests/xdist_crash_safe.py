"""--dist loadscope that survives a worker crash (a pytest plugin; tests/conftest.py loads it).

pytest-xdist's LoadScopeScheduling.remove_node puts every work unit the crashed worker ever had back in the queue,
finished ones included. The worker started in its place is then sent a finished unit as an empty list of tests:
it runs nothing, so it never reports back, so the scheduler never sends it more, and the run waits for ever (seen
in CI: "[gw0] node down: Not properly terminated", then nothing until the job's time limit). Here only the
unfinished units go back, without the test that was running when the worker died (reported as failed, as xdist
does), so the rest of its module still runs and the run ends with that failure.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CrashSafeLoadScope(LoadScopeScheduling):
        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            unfinished = {scope: dict(unit) for scope, unit in workload.items() if not all(unit.values())}
            if not unfinished:
                return None
            crashed = next(nodeid for unit in unfinished.values() for nodeid, done in unit.items() if not done)
            for scope, unit in unfinished.items():
                if crashed in unit:
                    unit[crashed] = True  # reported as the crash; not run again
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return CrashSafeLoadScope(config, log)

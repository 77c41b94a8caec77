"""The library internals taskherd relies on (taskherd.compat) are all still there, and a missing one
is reported naming the library, its installed version and what taskherd needs it for."""
from importlib import metadata

from taskherd import compat


def test_every_internal_taskherd_relies_on_exists_in_the_installed_libraries():
    assert compat.problems() == []
    assert {internal.library for internal in compat.INTERNALS} == {"kombu", "celery", "billiard", "amqp",
                                                                   "prometheus-client", "redis", "psycopg"}


def test_a_changed_internal_is_named_with_library_version_and_purpose():
    gone = compat.Internal("kombu", "kombu.transport.redis:QoS.no_such_method", "callable", why="test the seam")
    problem = gone.problem()
    assert problem.startswith(f"kombu {metadata.version('kombu')}: kombu.transport.redis:QoS.no_such_method is gone")
    assert problem.endswith("taskherd uses it to test the seam")
    renamed = compat.Internal("kombu", "kombu.transport.redis:Channel._q_for_pri", "callable",
                              parameters=("queue", "priority_level"), why="test the seam")
    assert "lacks parameter(s) ['priority_level']" in renamed.problem()
    unset = compat.Internal("billiard", "billiard.pool:ApplyResult", "instance attributes",
                            parameters=("_accepted", "_no_such_field"), why="test the seam")
    assert "no longer sets ['_no_such_field']" in unset.problem()

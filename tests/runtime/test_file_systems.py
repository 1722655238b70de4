"""vit_plugin.runtime.file_systems: one fsspec file system per protocol and process; a forked child makes
its own and sets its parent's aside, unused."""
import multiprocessing

from vit_plugin.runtime import file_systems, fork_hooks
from vit_plugin.runtime.file_systems import file_system


def _report_in_child(conn, parents):
    inherited = list(file_systems._INHERITED)
    fs = file_system('memory')
    conn.send((any(fs is x for x in inherited), [type(x).__name__ for x in inherited[-len(parents):]],
               file_system('memory') is fs))
    conn.close()


def test_a_process_keeps_one_file_system_per_protocol_and_a_forked_child_its_own():
    fs = file_system('memory')
    assert file_system('memory') is fs
    assert 'vit_plugin.runtime.file_systems:set_aside_in_child' in fork_hooks()
    parents = [type(x).__name__ for x in file_systems._FILE_SYSTEMS.values()]
    ctx = multiprocessing.get_context('fork')
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_report_in_child, args=(child, parents))
    process.start()
    got = parent.recv() if parent.poll(60) else 'no answer'
    process.join(10)
    assert got == (False, parents, True)  # a file system of its own; the parent's set aside
    assert file_system('memory') is fs  # the parent keeps its own

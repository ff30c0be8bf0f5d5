"""The sandbox's child programs are files of the package (opdgrpo/sandbox/programs), joined with their common part:
each joined text compiles, every file belongs to a program, and the host sends exactly these texts."""

from __future__ import annotations

from importlib import resources

import pytest

from opdgrpo.sandbox import execution
from opdgrpo.sandbox import isolation as sandbox
from opdgrpo.sandbox import stdio as stdio_execution
from opdgrpo.sandbox.programs import PARTS, program


@pytest.mark.parametrize("name", sorted(PARTS))
def test_each_program_compiles_as_sent(name):
    compile(program(name), f"<{name}>", "exec")


def test_every_file_belongs_to_a_program():
    files = {f.name.removesuffix(".py") for f in resources.files("opdgrpo.sandbox.programs").iterdir()
             if f.name.endswith(".py") and f.name != "__init__.py"}
    assert files == {part for parts in PARTS.values() for part in parts}


def test_shared_helpers_are_defined_once_and_sent_with_each_user():
    for user, common, helper in (("launcher", "launch_common", "def set_limits("),
                                 ("bwrap_init", "launch_common", "def set_limits("),
                                 ("function_harness", "harness_common", "def kill_all("),
                                 ("stdio_harness", "harness_common", "def kill_all(")):
        assert program(user).count(helper) == 1 and PARTS[user][0] == common


def test_the_host_sends_the_files_texts():
    assert sandbox._LAUNCHER == program("launcher") and sandbox._BWRAP_INIT == program("bwrap_init")
    assert execution._HARNESS == program("function_harness") and stdio_execution._HARNESS == program("stdio_harness")

"""How the plan names a study's student in run ids: shared by the planner and the studies' declarations, which the
report imports, so it lives apart from the planner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def study_student(block: Mapping[str, Any]) -> str:
    """The model a study trains (``studies.<S>.student``; the model named ``student`` by default)."""
    return str(block.get("student") or "student")


def into(student: str) -> str:
    """Run-id part naming a non-default student (``into_student_8b-``); empty for the default, so ids stay stable."""
    return "" if student == "student" else f"into_{student}-"

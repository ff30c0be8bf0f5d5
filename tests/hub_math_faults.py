"""Worker faults for tests/integration/test_hub_math_fixtures.py: a replacement math check that hangs or kills its process.

It lives in its own small module because MathVerifier's workers import a replacement check by name.
"""

from __future__ import annotations

import os
import signal
import time

from opdgrpo.verifiers.math import verify_one


def faulty_check(gold: str, completion: str, timeout_s: float) -> bool:
    """``HANG``: block where no alarm can help (alarms ignored, as in C code); ``DIE``: exit at once."""
    if "HANG" in completion:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(3600)
    if "DIE" in completion:
        os._exit(3)
    return verify_one(gold, completion, timeout_s)

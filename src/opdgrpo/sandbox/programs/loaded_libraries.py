"""The files an interpreter (``python -I -S -c`` with this text) maps once it has imported every extension module on
its path: the loader itself finds them (with ``ld.so.cache``, RPATHs and dlopen), in one process. Prints them as a
JSON list on the last line."""

import importlib
import json
import os
import sys

if __name__ == "__main__":
    for name in sorted({n.split(".")[0] for d in sys.path if os.path.isdir(d) for n in os.listdir(d) if ".so" in n}):
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    with open("/proc/self/maps") as fh:
        rows = [line.split(None, 5) for line in fh]
    sys.stdout.write("\n" + json.dumps(sorted({r[5].strip() for r in rows if len(r) == 6 and r[5].startswith("/")})) + "\n")

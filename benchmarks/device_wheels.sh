#!/bin/bash
# .whl and .deb for the GPU machine with every runtime dependency in pyproject.toml: the shared
# tool's default list is the service stack of its day and lacks the newer ones (flask-limiter,
# prometheus-client, pylti1p3next, ...), so the API's workers failed to boot there (run 28).
# torch, triton and numpy are the GPU image's own. Usage, from anywhere in the repository:
#   benchmarks/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mapfile -t deps < <("$PY" - <<'PYEOF'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for d in deps:
    name = re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower()
    if name not in {"torch", "triton", "numpy"}:
        print(d.split(";")[0].strip())
PYEOF
)
DEB=1 exec bash ../shared/tools/device-wheels.sh "${deps[@]}"

"""Which sandbox GPU view works on this host (``KGRADE_SANDBOX_GPU_VIEW``), checked for real.

For the last GPU of the host (the one a second worker owns), start the grader's own bubblewrap
sandbox in each view, initialise CUDA there and compare the PCI bus id CUDA reports with the one
nvidia-smi gives for that index: a view passes only when the job lands on exactly its own GPU.
Prints a table on stderr and the first passing view on stdout (for ``export
KGRADE_SANDBOX_GPU_VIEW=$(python benchmarks/gpu_view_probe.py)``); exits 1 when none passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.harness.job import job_gpus  # noqa: E402
from workers.sandbox import GPU_VIEW_ENV, GPU_VIEWS, SandboxSpec, build_argv  # noqa: E402

PROGRAM = (
    "import torch; p = torch.cuda.get_device_properties(0); "
    "print(torch.cuda.device_count(), "
    "'%04x:%02x:%02x' % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id), "
    "float(torch.ones(8, device='cuda').sum()))"
)


def nvidia_smi_bus(index: int) -> str:
    out = subprocess.run(
        ["nvidia-smi", "-i", str(index), "--query-gpu=pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dom, bus, dev = out.split(":")  # 00000000:18:00.0
    return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev.split('.')[0], 16):02x}"


def main() -> int:
    count = len(
        subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    index = count - 1
    want = nvidia_smi_bus(index)
    os.environ["KGRADE_GPUS"] = str(index)
    _, cuda_env = job_gpus(1)
    passing = []
    for view in GPU_VIEWS:
        os.environ[GPU_VIEW_ENV] = view
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o777)
            env = {"PATH": "/usr/bin:/bin", "HOME": tmp, **cuda_env}
            for k in ("LD_LIBRARY_PATH", "CUDA_HOME"):
                if k in os.environ:
                    env[k] = os.environ[k]
            spec = SandboxSpec(
                cwd=Path(tmp),
                rw_paths=[Path(tmp)],
                env=env,
                device="cuda",
                gpu_indices=[index],
                isolation="bwrap",
            )
            argv, _ = build_argv(spec, [sys.executable, "-I", "-c", PROGRAM])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        got = r.stdout.split()
        ok = r.returncode == 0 and len(got) == 3 and got[1] == want and got[2] == "8.0"
        detail = " ".join(got) if r.returncode == 0 else r.stderr.strip().splitlines()[-1:]
        print(
            f"{view:<9} {'ok' if ok else 'no':<3} GPU {index} ({want}): {detail}", file=sys.stderr
        )
        if ok:
            passing.append(view)
    if not passing:
        return 1
    print(passing[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())

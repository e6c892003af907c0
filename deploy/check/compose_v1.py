"""docker-compose 1.x, reading `security_opt: [systempaths=unconfined]` as Compose v2 does.

`systempaths=unconfined` is not an engine option: the docker CLI and Compose v2 turn it into
empty `MaskedPaths` and `ReadonlyPaths` in the container's HostConfig (Docker's masks over
parts of /proc, which stop bubblewrap from mounting a /proc of its own). Compose 1.29, the one
Debian 12 ships, passes it to the engine as it is, and the engine refuses the container
("invalid --security-opt 2"). This wrapper makes the same request Compose v2 makes, so that
deploy/check/run.sh tests the compose file as written on a machine with Debian's Compose:

    /usr/bin/python3 deploy/check/compose_v1.py -p kgrade-check -f FILE up -d ...

It runs under the Python that has Compose 1.x (the `docker-compose` script's interpreter).
"""

from __future__ import annotations

import sys
from typing import Any

from compose.cli.main import main  # type: ignore[import-not-found]
from docker.api.container import ContainerApiMixin  # type: ignore[import-not-found]

UNCONFINED = "systempaths=unconfined"
_create = ContainerApiMixin.create_container_from_config


def _create_unmasked(self: Any, config: dict[str, Any], name: str | None = None) -> Any:
    host = config.get("HostConfig") or {}
    opts = host.get("SecurityOpt") or []
    if UNCONFINED in opts:
        host["SecurityOpt"] = [o for o in opts if o != UNCONFINED]
        host["MaskedPaths"] = []
        host["ReadonlyPaths"] = []
    return _create(self, config, name)


ContainerApiMixin.create_container_from_config = _create_unmasked

if __name__ == "__main__":
    sys.argv[0] = "docker-compose"
    sys.exit(main())

"""Where explain's per-head tasks run (headsurgeon/scaleout/): the executor, the Ray cluster, the task size, and
where workers read the store."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.argtypes import positive_int
from ..core.configs import setting

__all__ = ["ScaleoutConfig"]


@dataclass(frozen=True)
class ScaleoutConfig:
    """The scale-out settings; the command line's ``--ray [ADDRESS]`` sets ``executor`` and ``address`` together."""

    executor: str = setting("local", flag=None, help="'local' (this machine's processes) or 'ray'")
    workers: int | None = setting(None, type=positive_int,
                                  help="processes for the head tasks on this machine (default: every core this "
                                       "process may use; 1 runs them in this process)")
    address: str | None = setting(
        None, flag="--ray", nargs="?", const="", metavar="ADDRESS",
        help="search and select on Ray: on the cluster at ADDRESS (HOST:PORT, e.g. 10.0.0.1:6379), or on a local "
             "Ray runtime when no ADDRESS follows (pip install 'headsurgeon[ray]')")
    heads_per_task: int | None = setting(None, type=positive_int,
                                         help="heads per task (default: locally, tasks that shrink toward the end "
                                              "of the run; on Ray, the heads spread over the cluster's CPUs)")
    store_url: str | None = setting(None, metavar="URL",
                                    help="where Ray workers read OUT/store (a shared path or an fsspec URL) when "
                                         "not at OUT/store")

    @classmethod
    def from_ray_flag(cls, address: str | None, **settings: Any) -> "ScaleoutConfig":
        """The config for ``--ray [ADDRESS]``: None (not given) runs locally, "" on a local Ray runtime."""
        return cls(executor="local" if address is None else "ray", address=address or None, **settings)

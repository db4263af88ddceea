"""The Ray executor: connect (or start a local runtime), check every node can read the store, then run one Ray
task per chunk of heads and hand each finished chunk's records to the journal as it arrives.

Ray is imported only here, so a local explain never loads it. A task whose worker dies is retried by Ray
(``max_retries``); a task that raises ``OSError`` (a shared filesystem hiccup) is retried too (``retry_exceptions``).
"""
from __future__ import annotations

import socket
from typing import Any, Callable

from .chunks import MAX_HEADS_PER_TASK, chunked
from .headstore import HeadStore, StoreUnreachable
from .task import HeadJob, explain_heads
from ..core import Head, HeadsurgeonError


class ClusterError(HeadsurgeonError, ConnectionError, ValueError):
    """The Ray cluster cannot be reached, or a task failed for good on it (the CLI reports it as one line)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("executor='ray' needs Ray: pip install 'headsurgeon[ray]' (or pip install 'ray>=2.9')") from None
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the fix, when nothing listens at a ``HOST:PORT`` (or ``ray://HOST:PORT``) address."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"Ray address {address!r} is not HOST:PORT (e.g. 127.0.0.1:6379 or ray://head:10001)")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(f"cannot reach a Ray cluster at {address} ({e.strerror or e}); start one there with "
                           f"`ray start --head --port={port}`, or give no address to run on a local Ray runtime") from None


def connect(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at ``address``, or start a local runtime; False when this process was already connected."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError) as e:
            raise ClusterError(f"cannot join the Ray cluster at {address}: {e}") from None
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


def _probe(location: str) -> str:
    """Open the store's manifest and sequences from this worker (raises StoreUnreachable when it cannot)."""
    HeadStore(location, heads=[])
    return socket.gethostname()


def check_store_visible(location: str) -> None:
    """Run a probe on every alive node with CPUs; an error names the node that cannot read the store."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=1, max_retries=0)(_probe)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(location)
            for n in nodes]
    for node, ref in zip(nodes, refs):
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            where = f"a worker on node {node.get('NodeManagerAddress')}"
            if isinstance(e.cause, StoreUnreachable):
                raise StoreUnreachable(f"{where} cannot read the store: {e.cause}") from None
            raise ClusterError(f"{where} failed to open the store ({e.cause!r}); is headsurgeon installed there, in "
                               "the same version as here?") from None


def ray_map(job: HeadJob, heads: list[tuple[int, int]], finished: Callable[[list[dict]], None], *,
            address: str | None = None, heads_per_task: int | None = None, num_cpus: int | None = None,
            max_retries: int = 3) -> None:
    """Run ``explain_heads(job, chunk)`` for chunks of ``heads`` on Ray; ``finished(records)`` as each completes.

    ``heads_per_task`` None: the heads spread evenly over the cluster's CPUs, at most ``MAX_HEADS_PER_TASK`` a task.
    """
    ray = import_ray()
    started = connect(address, num_cpus)
    gate = None
    try:
        check_store_visible(job.store)
        if heads_per_task is None:
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            heads_per_task = min(MAX_HEADS_PER_TASK, max(1, -(-len(heads) // cpus)))
        chunks = chunked(heads, heads_per_task)
        if job.llm_gate:
            from .llmgate import start_gate

            from ..synth.search.llm.config import AgentConfig

            gate = start_gate(job.llm_gate, job.options.get("llm") or AgentConfig(progress=False))
        # one CPU per task (the numba kernels, headsurgeon/kernels/, are serial)
        task = ray.remote(explain_heads).options(num_cpus=1, max_retries=max_retries, retry_exceptions=[OSError])
        job_ref = ray.put(job)
        pending = {task.remote(job_ref, chunk): chunk for chunk in chunks}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    chunk = pending.pop(ref)
                    try:
                        records = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        raise ClusterError(f"heads {', '.join(map(Head.label, chunk))} failed on a worker: "
                                           f"{e.cause!r}") from None
                    except ray.exceptions.RayError as e:
                        raise ClusterError(f"heads {', '.join(map(Head.label, chunk))} failed after {max_retries} "
                                           f"retries: {e}") from None
                    finished(records)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if gate is not None:
            ray.kill(gate)
        if started:
            ray.shutdown()

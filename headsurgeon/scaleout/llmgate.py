"""The LLM agent's caps across a Ray cluster: one named actor holds the request slots (``concurrency``) and the
spent cost (``cost_cap``) for every worker, and each worker's agent sends its requests through a client that asks
the actor first (headsurgeon/synth/search/llm/agent.py ``LLMSearcher(client=...)``; prices as headsurgeon/synth/search/llm/transport.py).
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from ..synth.search.llm.transport import CostCapReached


class LLMGate:
    """The cluster's request slots and spent cost (a Ray actor: create with :func:`start_gate`)."""

    def __init__(self, concurrency: int, cost_cap: float | None) -> None:
        self.concurrency, self.cost_cap = int(concurrency), cost_cap
        self.cost, self.requests, self.in_flight, self.max_in_flight, self.refused = 0.0, 0, 0, 0, 0
        self._slots: asyncio.Semaphore | None = None

    def _capped(self) -> bool:
        return self.cost_cap is not None and self.cost >= self.cost_cap

    async def acquire(self) -> bool:
        """Wait for a free request slot; False (no slot taken) once the cluster's cost reached the cap."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        if self._capped():
            self.refused += 1
            return False
        await self._slots.acquire()
        if self._capped():
            self._slots.release()
            self.refused += 1
            return False
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return True

    async def release(self, cost: float) -> None:
        """Give a slot back and add the request's cost."""
        self.cost += float(cost)
        self.in_flight -= 1
        assert self._slots is not None
        self._slots.release()

    async def stats(self) -> dict[str, Any]:
        return {"cost": self.cost, "requests": self.requests, "max_in_flight": self.max_in_flight,
                "refused": self.refused, "concurrency": self.concurrency, "cost_cap": self.cost_cap}


def start_gate(name: str, config: Any) -> Any:
    """Create (or find) the named gate actor for an ``AgentConfig``'s ``concurrency`` and ``cost_cap``."""
    import ray

    actor = ray.remote(LLMGate).options(name=name, get_if_exists=True, max_concurrency=1000)
    return actor.remote(config.concurrency, config.cost_cap)


class GatedClient:
    """An ``openai.OpenAI``-like client whose ``chat.completions.create`` takes a slot from the named gate first.

    ``inner``: the real client (default: the agent's own guarded client of the calling thread, built from
    ``config``). A refused slot raises ``CostCapReached``: the agent stops asking, as at its own cap.
    """

    def __init__(self, gate_name: str, config: Any, inner: Any = None) -> None:
        self.gate_name, self.config, self._inner = gate_name, config, inner
        self._builder: Any = None
        self._lock = threading.Lock()
        self.chat = self
        self.completions = self

    def _client(self) -> Any:
        if self._inner is not None:
            return self._inner
        with self._lock:
            if self._builder is None:
                from ..synth.search.llm.agent import LLMAgent

                self._builder = LLMAgent(self.config)  # its ``client`` property: one guarded client per thread
        return self._builder.client

    def create(self, **kwargs: Any) -> Any:
        import ray

        gate = ray.get_actor(self.gate_name)
        if not ray.get(gate.acquire.remote()):
            raise CostCapReached()
        cost = 0.0
        try:
            resp = self._client().chat.completions.create(**kwargs)
            usage = getattr(resp, "usage", None)
            pt = float(getattr(usage, "prompt_tokens", 0) or 0)
            ct = float(getattr(usage, "completion_tokens", 0) or 0)
            cost = pt / 1000.0 * self.config.price_prompt_per_1k + ct / 1000.0 * self.config.price_completion_per_1k
            return resp
        finally:
            ray.get(gate.release.remote(cost))

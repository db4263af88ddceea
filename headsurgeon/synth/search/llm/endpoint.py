"""``check_endpoint``: one cheap request before a run, so a dead LLM endpoint fails in seconds with its URL and the fix
(explain calls it before capture; otherwise the first sign is minutes of retries in llm_journal.jsonl)."""
from __future__ import annotations

from .config import AgentConfig, AgentConfigError

__all__ = ["EndpointError", "check_endpoint"]

OPENAI_DEFAULT = "https://api.openai.com/v1"  # where the openai client sends requests when no base URL is set


class EndpointError(AgentConfigError):
    """The configured LLM endpoint does not answer, or refuses the key; the message names the URL and the fix."""


def check_endpoint(config: AgentConfig | None = None, timeout: float = 5.0) -> None:
    """GET ``{base_url}/models`` once (headers only, ``timeout`` s per phase): raise EndpointError unless it answers.

    Any HTTP answer below 500 but 401/403 counts as alive (a server without ``/models`` answers 404). Without a
    configured model or endpoint nothing is checked: the agent is then skipped with its own note.
    """
    import httpx

    cfg = config or AgentConfig()
    if not cfg.model or not (cfg.base_url or cfg.api_key):
        return
    base = (cfg.base_url or OPENAI_DEFAULT).rstrip("/")
    fix = ("start the server (e.g. `vllm serve MODEL --port 8000`, `ollama serve`), or point --llm-base-url / "
           "HEADSURGEON_LLM_BASE_URL at a running one, or leave 'llm' out of the searchers")
    headers = {"Authorization": f"Bearer {cfg.api_key or 'not-needed'}", "Accept-Encoding": "identity"}
    wait = min(float(timeout), float(cfg.request_timeout))
    try:
        with httpx.Client(timeout=wait, follow_redirects=False) as client:
            with client.stream("GET", f"{base}/models", headers=headers) as response:
                status = response.status_code  # the body is never read
    except httpx.HTTPError as e:
        raise EndpointError(f"the LLM endpoint {base} does not answer ({type(e).__name__}: {str(e)[:120]}): "
                            f"{fix}") from None
    except ValueError as e:  # a malformed URL
        raise EndpointError(f"the LLM endpoint {base!r} is not a usable URL ({e}); write e.g. "
                            "http://127.0.0.1:8000/v1") from None
    if status in (401, 403):
        raise EndpointError(f"the LLM endpoint {base} refused the API key (HTTP {status}): pass the right key "
                            "(--llm-api-key, HEADSURGEON_LLM_API_KEY or OPENAI_API_KEY)")
    if status >= 500:
        raise EndpointError(f"the LLM endpoint {base} answers HTTP {status} (not ready or broken): wait until it has "
                            f"loaded the model, or {fix}")
